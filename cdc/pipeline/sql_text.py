"""What a pipeline's SQL names, read from its text (no Spark): the tables and the columns it reads."""

from __future__ import annotations

import re

# Spark SQL's string literals take single or double quotes.
_COMMENTS_AND_STRINGS = re.compile(r"--[^\n]*|/\*.*?\*/|'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", re.S)
_TABLE_REFERENCE = re.compile(r"\b(?:from|join)\s+(`[^`]+`|[A-Za-z_][\w.]*)(\s*\()?", re.I)
_CTE = re.compile(r"(?:\bwith|,)\s*(?:recursive\s+)?([A-Za-z_]\w*)\s+as\s*\(", re.I)


def sql_tables(sql: str) -> set[str]:
    """The plain table names a query reads (after FROM and JOIN), minus its CTEs and function calls.

    Qualified names (``delta.`/path```, ``db.table``) are not pipeline tables and are left out.
    """
    text = _COMMENTS_AND_STRINGS.sub(" ", sql)
    ctes = {name.lower() for name in _CTE.findall(text)}
    names = set()
    for reference, call in _TABLE_REFERENCE.findall(text):
        name = reference.strip("`")
        if not call and "." not in name and name.lower() not in ctes:
            names.add(name)
    return names


_NOT_ALIASES = frozenset(
    {
        "where",
        "join",
        "left",
        "right",
        "inner",
        "outer",
        "full",
        "cross",
        "on",
        "group",
        "order",
        "having",
        "limit",
        "union",
        "using",
        "natural",
        "lateral",
        "window",
        "qualify",
        "except",
        "intersect",
        "",
    }
)


def reads_column(sql: str, table: str, column: str) -> bool:
    """Whether the query names ``column`` as a column it may read from ``table``: unqualified, or qualified by
    the table's name or an alias of it; never as an alias it defines (``... AS column``), nor in a string
    or a comment. (Read from the text: an unqualified name of another table's column counts too.)"""
    text = _COMMENTS_AND_STRINGS.sub(" ", sql)
    names = {table.lower()}
    for alias in re.findall(rf"\b(?:from|join)\s+`?{re.escape(table)}`?\s+(?:as\s+)?([A-Za-z_]\w*)", text, flags=re.I):
        if alias.lower() not in _NOT_ALIASES:
            names.add(alias.lower())
    reference = re.compile(rf"(?:(`?)([A-Za-z_]\w*)\1\s*\.\s*)?`?\b{re.escape(column)}\b`?", re.I)
    for match in reference.finditer(text):
        qualifier = match.group(2)
        if qualifier is not None:
            if qualifier.lower() in names:
                return True
            continue
        if re.search(r"\bas\s*$", text[: match.start()], flags=re.I) or text[: match.start()].rstrip().endswith("."):
            continue  # an alias it defines, or a field of another column
        return True
    return False
