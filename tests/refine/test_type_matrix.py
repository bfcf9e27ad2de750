"""Every column type of the Debezium Postgres connector, through the real stack (Postgres 15, Debezium,
Kafka, `cdc raw`, `cdc refine`), under each connector setting that changes how values are encoded: every
cell of the refined table equals the value Postgres itself returns (psycopg), compared in a canonical
form per kind of column (KINDS). What Debezium cannot send is listed, each a documented limit
(docs/reference/postgres-types.md); values Spark cannot hold go to the quarantine naming the column.

One table and one connector per case, shared by the module (snapshot reads, then streamed changes).
"""

from __future__ import annotations

import base64
import json
import re
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import NamedTuple

import psycopg
import pytest

from cdc.stack.postgres import remove_connector
from connectors import definitions
from connectors.client import ConnectClient
from connectors.definitions import ConnectorDefinition
from refine.quality.quarantine import quarantine_location


class Col(NamedTuple):
    """A matrix column: its Postgres type, how its values compare (``kind``: see :data:`KINDS`), its four
    ordinary values as SQL literals (rows 1-5, see :func:`insert_rows`), optionally row 6's value, one Spark
    cannot hold (``beyond``: the row is quarantined), a value Debezium cannot send whole with the value its
    output refines to (``lossy``: in row 7; in row 8 for arrays of text-like types, whose two dimensions
    Debezium garbles and the row is quarantined), and the type declared for it on the schemaless topic."""

    name: str
    pg_type: str
    kind: str
    values: tuple
    beyond: str | None = None
    lossy: tuple | None = None
    declared: str | None = None


COLUMNS = [
    Col("c_int2", "smallint", "int", ("1", "-32768", "32767", "0"), declared="smallint"),
    Col("c_int4", "integer", "int", ("2", "-2147483648", "2147483647", "0"), declared="int"),
    Col("c_int8", "bigint", "int", ("3", "-9223372036854775808", "9223372036854775807", "0"), declared="bigint"),
    Col("c_real", "real", "float4", ("1.5", "'NaN'", "'Infinity'", "'-Infinity'"), declared="float"),
    Col("c_double", "double precision", "float", ("2.5e300", "'NaN'", "'-Infinity'", "'Infinity'"), declared="double"),
    Col(
        "c_num_10_2",
        "numeric(10,2)",
        "decimal",
        ("12.34", "-99999999.99", "99999999.99", "0.01"),
        declared="decimal(10,2)",
    ),
    Col("c_num_38_0", "numeric(38,0)", "decimal", ("1", "-" + "9" * 38, "9" * 38, "0"), declared="decimal(38,0)"),
    Col(
        "c_num_38_38",
        "numeric(38,38)",
        "decimal",
        ("0.1", "-0." + "9" * 38, "0." + "0" * 37 + "1", "0"),
        declared="decimal(38,38)",
    ),
    Col(
        "c_num_scale_gt_precision",
        "numeric(2,4)",
        "decimal",
        ("0.0012", "-0.0099", "0.0099", "0"),
        declared="decimal(4,4)",
    ),
    Col("c_num_neg_scale", "numeric(5,-2)", "decimal", ("12300", "-9999900", "9999900", "0"), declared="string"),
    Col(
        "c_num_60_10",
        "numeric(60,10)",
        "decimal",
        ("1.5", "-1234567890123456789012345678.0123456789", "0.0000000001", "0"),
        beyond="9" * 50 + "." + "9" * 10,
        declared="string",
    ),
    Col(
        "c_numeric",
        "numeric",
        "decimal",
        ("1.5", "'NaN'", "-0.000000000000000001", "123456789012345678.5"),
        beyond="123456789012345678901234567890.123456789",
        declared="string",
    ),
    Col("c_numeric_inf", "numeric", "decimal", ("'Infinity'", "'-Infinity'", "-0.5", "100"), declared="string"),
    Col(
        "c_money",
        "money",
        "money",
        ("12.34", "-92233720368547758.08", "92233720368547758.07", "0"),
        declared="decimal(19,2)",
    ),
    Col("c_char", "char(5)", "text", ("'ab'", "''", "'abcde'", "' x'"), declared="string"),
    Col("c_varchar", "varchar(20)", "text", ("'hello'", "''", "'ünïcødé ✓'", "'a''quote'"), declared="string"),
    Col(
        "c_text",
        "text",
        "text",
        ("'text'", "''", "E'line\\nbreak\\ttab \"q\" \\\\'", "repeat('x', 100)"),
        declared="string",
    ),
    Col("c_citext", "citext", "text", ("'MiXeD'", "''", "'x'", "'Y'"), declared="string"),
    Col("c_bytea", "bytea", "bytes", ("'\\xdeadbeef'", "'\\x'", "'\\x00ff00'", "'\\x7f'"), declared="binary"),
    Col("c_oid", "oid", "int", ("1", "0", "4294967295", "12345"), declared="bigint"),
    Col("c_name", "name", "text", ("'a name'", "''", "'ünï'", "'x'"), declared="string"),
    Col("c_char1", '"char"', "text", ("'x'", "'Z'", "'1'", "'-'"), declared="string"),
    Col("c_lsn", "pg_lsn", "absent", ("'16/B374D848'", "'0/0'", "'FFFFFFFF/FFFFFFFF'", "'1/1'")),
    Col("c_tsquery", "tsquery", "absent", ("'fat & (rat | cat)'", "''", "'a'", "'!b'")),
    Col("c_jsonpath", "jsonpath", "absent", ("'$.a[*] ? (@ > 1)'", "'$'", "'$.b'", "'strict $.c'")),
    Col("c_multirange", "int4multirange", "absent", ("'{[1,3), [5,7)}'", "'{}'", "'{[1,2)}'", "'{(,)}'")),
    Col("c_composite", "{pair}", "absent", ("ROW(1, 'q')", "ROW(NULL, NULL)", "ROW(-1, '')", "ROW(2, 'x')")),
    Col("c_bool", "boolean", "plain", ("true", "false", "true", "false"), declared="boolean"),
    Col(
        "c_date",
        "date",
        "date",
        ("'2026-11-27'", "'0001-01-01'", "'9999-12-31'", "'1969-12-31'"),
        beyond="'5874897-12-31'",
        lossy=("'4713-01-01 BC'", 1001860),
        declared="date",
    ),  # a snapshot loses BC
    Col(
        "c_date_inf",
        "date",
        "date",
        ("'2000-01-01'", "'2000-01-02'", "'2000-01-03'", "'2000-01-04'"),
        beyond="'infinity'",
        declared="date",
    ),
    Col(
        "c_date_ninf",
        "date",
        "date",
        ("'2000-01-01'", "'2000-01-02'", "'2000-01-03'", "'2000-01-04'"),
        beyond="'-infinity'",
        declared="date",
    ),
    Col(
        "c_time",
        "time",
        "time",
        ("'13:45:00.123456'", "'00:00:00'", "'23:59:59.999999'", "'24:00:00'"),
        declared="time",
    ),
    Col(
        "c_time3",
        "time(3)",
        "time",
        ("'13:45:00.123'", "'00:00:00'", "'23:59:59.999'", "'12:00:00.5'"),
        declared="time(3)",
    ),
    Col("c_time0", "time(0)", "time", ("'13:45:01'", "'00:00:00'", "'23:59:59'", "'24:00:00'"), declared="time(0)"),
    Col(
        "c_timetz",
        "timetz",
        "timetz",
        ("'13:45:00.123456+02'", "'00:00:00+14'", "'23:59:59.999999-12'", "'12:00:00Z'"),
        declared="string",
    ),
    Col(
        "c_ts",
        "timestamp",
        "timestamp",
        (
            "'2026-11-27 13:45:00.123456'",
            "'0001-01-01 00:00:00'",
            "'9999-12-31 23:59:59.999999'",
            "'1969-12-31 23:59:59.999999'",
        ),
        beyond="'294276-12-31 23:59:59.999999'",
        declared="timestamp_ntz",
    ),
    Col(
        "c_ts3",
        "timestamp(3)",
        "timestamp",
        (
            "'2026-11-27 13:45:00.123'",
            "'0001-01-01 00:00:00'",
            "'9999-12-31 23:59:59.999'",
            "'1969-12-31 23:59:59.999'",
        ),
        beyond="'4713-01-01 00:00:00 BC'",
        declared="timestamp_ntz(3)",
    ),
    Col(
        "c_ts_inf",
        "timestamp",
        "timestamp",
        ("'2000-01-01'", "'2000-01-02'", "'2000-01-03'", "'2000-01-04'"),
        beyond="'infinity'",
        declared="timestamp_ntz",
    ),
    Col(
        "c_ts_ninf",
        "timestamp",
        "timestamp",
        ("'2000-01-01'", "'2000-01-02'", "'2000-01-03'", "'2000-01-04'"),
        beyond="'-infinity'",
        declared="timestamp_ntz",
    ),
    Col(
        "c_tstz",
        "timestamptz",
        "timestamptz",
        (
            "'2026-11-27 13:45:00.123456+05:30'",
            "'0001-01-01 00:00:00Z'",
            "'9999-12-31 23:59:59.999999Z'",
            "'1969-12-31 23:59:59.999999Z'",
        ),
        beyond="'10000-01-01 00:00:00Z'",
        declared="timestamp",
    ),
    Col(
        "c_tstz3",
        "timestamptz(3)",
        "timestamptz",
        (
            "'2026-11-27 13:45:00.123+05:30'",
            "'0001-01-01 00:00:00Z'",
            "'9999-12-31 23:59:59.999Z'",
            "'1969-12-31 23:59:59.999Z'",
        ),
        declared="timestamp",
    ),
    Col(
        "c_tstz_inf",
        "timestamptz",
        "timestamptz",
        ("'2000-01-01Z'", "'2000-01-02Z'", "'2000-01-03Z'", "'2000-01-04Z'"),
        beyond="'infinity'",
        declared="timestamp",
    ),
    Col(
        "c_tstz_ninf",
        "timestamptz",
        "timestamptz",
        ("'2000-01-01Z'", "'2000-01-02Z'", "'2000-01-03Z'", "'2000-01-04Z'"),
        beyond="'-infinity'",
        declared="timestamp",
    ),
    Col(
        "c_interval",
        "interval",
        "interval",
        ("'1 year 2 months 3 days 04:05:06.789'", "'-3 days'", "'0'", "'-1 mon 2 days -00:00:01'"),
        beyond="'178000000 years'",
        declared="bigint",
    ),
    Col(
        "c_uuid",
        "uuid",
        "text",
        (
            "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",
            "'00000000-0000-0000-0000-000000000000'",
            "'ffffffff-ffff-ffff-ffff-ffffffffffff'",
            "gen_random_uuid()",
        ),
        declared="string",
    ),
    Col(
        "c_json",
        "json",
        "text",
        ('\'{"a": [1, 2.5, null], "b": "ü"}\'', "'null'", "'[]'", "'\"s\"'"),
        declared="string",
    ),
    Col(
        "c_jsonb",
        "jsonb",
        "text",
        ('\'{"a": [1, 2.5, null], "b": "ü"}\'', "'null'", "'[]'", '\'{"k": {"n": 1e2}}\''),
        declared="string",
    ),
    Col(
        "c_xml", "xml", "text", ("'<a b=\"1\">x</a>'", "'<r/>'", "'text only'", "'<a><b>ü</b></a>'"), declared="string"
    ),
    Col(
        "c_inet",
        "inet",
        "text",
        ("'192.168.0.1/24'", "'::1'", "'10.0.0.1'", "'2001:db8::ff00:42:8329/64'"),
        declared="string",
    ),
    Col(
        "c_cidr", "cidr", "text", ("'192.168.0.0/24'", "'::/0'", "'10.0.0.1/32'", "'2001:db8::/32'"), declared="string"
    ),
    Col(
        "c_macaddr",
        "macaddr",
        "text",
        ("'08:00:2b:01:02:03'", "'00:00:00:00:00:00'", "'ff:ff:ff:ff:ff:ff'", "'08-00-2b-01-02-04'"),
        declared="string",
    ),
    Col(
        "c_macaddr8",
        "macaddr8",
        "text",
        ("'08:00:2b:01:02:03:04:05'", "'00:00:00:00:00:00:00:00'", "'ff:ff:ff:ff:ff:ff:ff:ff'", "'08:00:2b:01:02:03'"),
        declared="string",
    ),
    Col("c_bit1", "bit(1)", "bit1", ("B'1'", "B'0'", "B'1'", "B'0'"), declared="boolean"),
    Col("c_bit12", "bit(12)", "bits", ("B'101000000001'", "B'000000000000'", "B'111111111111'", "B'000000000001'")),
    Col("c_varbit", "varbit", "varbit", ("B'101'", "B''", "B'1111111100000000111'", "B'0011'")),
    Col("c_tsvector", "tsvector", "text", ("'a fat cat sat'", "''", "'''x y'':1A'", "'b:1,2 c'"), declared="string"),
    Col("c_ltree", "ltree", "text", ("'Top.Science.Astronomy'", "''", "'a'", "'a.b_c.D1'"), declared="string"),
    Col("c_hstore", "hstore", "hstore", ("'a=>1, b=>NULL'", "''", '\'"k e y"=>"v,=>"\'', "'x=>y'"), declared="string"),
    Col(
        "c_int4range",
        "int4range",
        "text",
        ("'[1,10)'", "'empty'", "'(,5]'", "'[-2147483648,2147483647)'"),
        declared="string",
    ),
    Col("c_int8range", "int8range", "text", ("'[1,10)'", "'empty'", "'[5,)'", "'(,)'"), declared="string"),
    Col("c_numrange", "numrange", "text", ("'[1.5,2.5]'", "'empty'", "'(,0.001)'", "'[1,1]'"), declared="string"),
    Col(
        "c_tsrange",
        "tsrange",
        "text",
        ("'[2026-01-01,2026-02-01)'", "'empty'", "'(,infinity)'", "'[2026-01-01 10:00:00.5,)'"),
        declared="string",
    ),
    Col(
        "c_tstzrange",
        "tstzrange",
        "text",
        ("'[2026-01-01Z,2026-02-01Z)'", "'empty'", "'[2026-01-01 10:00:00+02,)'", "'(,)'"),
        declared="string",
    ),
    Col(
        "c_daterange",
        "daterange",
        "text",
        ("'[2026-01-01,2026-02-01)'", "'empty'", "'[2026-01-01,]'", "'(,)'"),
        declared="string",
    ),
    Col("c_point", "point", "point", ("'(1.5,-2.25)'", "'(0,0)'", "'(1e300,-1e-300)'", "'(3,4)'")),
    Col("c_line", "line", "absent", ("'{1,-1,0}'", "'{0,1,2.5}'", "'{1,0,-3}'", "'{2,3,4}'")),
    Col("c_lseg", "lseg", "absent", ("'[(0,0),(1,1)]'", "'[(1.5,2),(3,-4)]'", "'[(0,0),(0,0)]'", "'[(1,2),(3,4)]'")),
    Col("c_box", "box", "absent", ("'(1,1),(0,0)'", "'(2.5,3),(-1,-2)'", "'(0,0),(0,0)'", "'(4,4),(1,1)'")),
    Col(
        "c_path", "path", "absent", ("'[(0,0),(1,1),(2,0)]'", "'((0,0),(1,1),(2,0))'", "'[(1.5,2)]'", "'((0,0),(1,0))'")
    ),
    Col(
        "c_polygon",
        "polygon",
        "absent",
        ("'((0,0),(1,1),(2,0))'", "'((0,0))'", "'((1.5,2),(3,4),(5,-6),(0,0))'", "'((1,1),(2,2))'"),
    ),
    Col("c_circle", "circle", "absent", ("'<(1,2),3>'", "'<(0,0),0>'", "'<(-1.5,2.5),0.5>'", "'<(1,1),1>'")),
    Col("c_enum", "{mood}", "text", ("'happy'", "'sad'", "'ok'", "'sad'"), declared="string"),
    Col("c_domain_int", "{positive}", "int", ("1", "2147483647", "5", "7"), declared="int"),
    Col("c_domain_text", "{short_text}", "text", ("'abc'", "''", "'xyz'", "'q'"), declared="string"),
    # Arrays: NULL elements and empty arrays; row 7 holds two dimensions, which Debezium sends as NULLs.
    Col(
        "a_int2",
        "smallint[]",
        "int",
        ("'{1,NULL,-32768}'", "'{}'", "'{32767}'", "'{0}'"),
        lossy=("'{{1,2},{3,4}}'", [None, None]),
        declared="array<smallint>",
    ),
    Col(
        "a_int4",
        "integer[]",
        "int",
        ("'{1,NULL,3}'", "'{}'", "'{2147483647}'", "'{0}'"),
        lossy=("'{{1,2},{3,4}}'", [None, None]),
        declared="array<int>",
    ),
    Col(
        "a_int8",
        "bigint[]",
        "int",
        ("'{1,NULL,-9223372036854775808}'", "'{}'", "'{9223372036854775807}'", "'{0}'"),
        lossy=("'{{1,2},{3,4}}'", [None, None]),
        declared="array<bigint>",
    ),
    Col(
        "a_real",
        "real[]",
        "float4",
        ("'{1.5,NULL,NaN}'", "'{}'", "'{Infinity,-Infinity}'", "'{0}'"),
        lossy=("'{{1},{2}}'", [None, None]),
        declared="array<float>",
    ),
    Col(
        "a_double",
        "double precision[]",
        "float",
        ("'{2.5e300,NULL,NaN}'", "'{}'", "'{Infinity,-Infinity}'", "'{0}'"),
        lossy=("'{{1},{2}}'", [None, None]),
        declared="array<double>",
    ),
    Col(
        "a_num_10_2",
        "numeric(10,2)[]",
        "decimal",
        ("'{12.34,NULL,-99999999.99}'", "'{}'", "'{0.01}'", "'{0}'"),
        lossy=("'{{1},{2}}'", [None, None]),
        declared="array<decimal(10,2)>",
    ),
    Col(
        "a_numeric",
        "numeric[]",
        "decimal",
        ("'{1.5,NULL,-0.000001}'", "'{}'", "'{123456789012345678.5}'", "'{0}'"),
        lossy=("'{1.5,NaN}'", None),
        declared="array<string>",
    ),
    Col(
        "a_oid",
        "oid[]",
        "int",
        ("'{1,NULL,4294967295}'", "'{}'", "'{0}'", "'{7}'"),
        lossy=("'{{1,2},{3,4}}'", [None, None]),
        declared="array<bigint>",
    ),
    Col("a_name", "name[]", "absent", ("'{a,NULL}'", "'{}'", "'{\"\"}'", "'{x}'")),
    Col("a_money", "money[]", "absent", ("'{12.34,NULL}'", "'{}'", "'{0}'", "'{1}'")),
    Col(
        "a_char",
        "char(3)[]",
        "text",
        ("'{ab,NULL,abc}'", "'{}'", "'{\"\"}'", "'{x}'"),
        lossy=("'{{a,b},{c,d}}'", [None, None]),
        declared="array<string>",
    ),
    Col(
        "a_varchar",
        "varchar(10)[]",
        "text",
        ("'{hello,NULL,\"\"}'", "'{}'", "'{\"a,b\"}'", "'{x}'"),
        lossy=("'{{a,b},{c,d}}'", [None, None]),
        declared="array<string>",
    ),
    Col(
        "a_text",
        "text[]",
        "text",
        ('\'{text,NULL,"NULL",""}\'', "'{}'", "ARRAY[E'q\"\\\\,{}']", "'{x}'"),
        lossy=("'{{a,b},{c,d}}'", [None, None]),
        declared="array<string>",
    ),
    Col(
        "a_citext",
        "citext[]",
        "text",
        ("'{MiXeD,NULL}'", "'{}'", "'{x}'", "'{Y}'"),
        lossy=("'{{a,b},{c,d}}'", [None, None]),
        declared="array<string>",
    ),
    Col(
        "a_bytea",
        "bytea[]",
        "bytes",
        ("ARRAY['\\xdeadbeef'::bytea, NULL]", "'{}'", "ARRAY['\\x'::bytea]", "ARRAY['\\x00'::bytea]"),
        lossy=("ARRAY[['\\x00'::bytea],['\\xff'::bytea]]", [None, None]),
        declared="array<binary>",
    ),
    Col(
        "a_bool",
        "boolean[]",
        "plain",
        ("'{t,NULL,f}'", "'{}'", "'{t}'", "'{f}'"),
        lossy=("'{{t,f},{f,t}}'", [None, None]),
        declared="array<boolean>",
    ),
    Col(
        "a_date",
        "date[]",
        "date",
        ("'{2026-11-27,NULL,1900-01-01}'", "'{}'", "'{1970-01-01}'", "'{1969-12-31}'"),
        lossy=("'{{2026-01-01},{2026-01-02}}'", [None, None]),
        declared="array<date>",
    ),
    Col(
        "a_time",
        "time[]",
        "time",
        ("'{13:45:00.123456,NULL}'", "'{}'", "'{23:59:59.999999}'", "'{00:00:01}'"),
        lossy=("'{{00:00:01},{00:00:02}}'", [None, None]),
        declared="array<time>",
    ),
    Col(
        "a_timetz",
        "timetz[]",
        "timetz",
        ("'{13:45:00.123456+02,NULL}'", "'{}'", "'{12:00:00-05}'", "'{00:00:01Z}'"),
        lossy=("'{{00:00:01Z},{00:00:02Z}}'", [None, None]),
        declared="array<string>",
    ),
    Col(
        "a_ts",
        "timestamp[]",
        "timestamp",
        (
            "'{\"2026-11-27 13:45:00.123456\",NULL}'",
            "'{}'",
            "'{\"1969-12-31 23:59:59.999999\"}'",
            "'{\"2026-01-01 00:00:00\"}'",
        ),
        lossy=('\'{{"2026-01-01 00:00:00"},{"2026-01-02 00:00:00"}}\'', [None, None]),
        declared="array<timestamp_ntz>",
    ),
    Col(
        "a_tstz",
        "timestamptz[]",
        "timestamptz",
        (
            "'{\"2026-11-27 13:45:00.123456+05:30\",NULL}'",
            "'{}'",
            "'{\"1969-12-31 23:59:59.999999Z\"}'",
            "'{\"2026-01-01 00:00:00Z\"}'",
        ),
        lossy=('\'{{"2026-01-01 00:00:00Z"},{"2026-01-02 00:00:00Z"}}\'', [None, None]),
        declared="array<timestamp>",
    ),
    Col("a_interval", "interval[]", "absent", ("'{\"1 year 2 months\",NULL}'", "'{}'", "'{-1 hour}'", "'{1 day}'")),
    Col(
        "a_uuid",
        "uuid[]",
        "text",
        (
            "'{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11,NULL}'",
            "'{}'",
            "'{ffffffff-ffff-ffff-ffff-ffffffffffff}'",
            "'{00000000-0000-0000-0000-000000000000}'",
        ),
        lossy=("'{{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11},{00000000-0000-0000-0000-000000000000}}'", [None, None]),
        declared="array<string>",
    ),
    Col(
        "a_json",
        "json[]",
        "text",
        ("ARRAY['{\"a\": 1}'::json, NULL, 'null'::json]", "'{}'", "ARRAY['[]'::json]", "ARRAY['2'::json]"),
        lossy=("ARRAY[['1'::json],['2'::json]]", [None, None]),
        declared="array<string>",
    ),
    Col(
        "a_jsonb",
        "jsonb[]",
        "text",
        ("ARRAY['{\"a\": 1}'::jsonb, NULL, 'null'::jsonb]", "'{}'", "ARRAY['[]'::jsonb]", "ARRAY['2'::jsonb]"),
        lossy=("ARRAY[['1'::jsonb],['2'::jsonb]]", [None, None]),
        declared="array<string>",
    ),
    Col("a_xml", "xml[]", "absent", ("ARRAY['<a/>'::xml, NULL]", "'{}'", "ARRAY['t'::xml]", "ARRAY['<b/>'::xml]")),
    Col(
        "a_inet",
        "inet[]",
        "text",
        ("'{192.168.0.1/24,NULL,::1}'", "'{}'", "'{0.0.0.0}'", "'{10.0.0.1}'"),
        lossy=("'{{10.0.0.1},{10.0.0.2}}'", [None, None]),
        declared="array<string>",
    ),
    Col(
        "a_cidr",
        "cidr[]",
        "text",
        ("'{192.168.0.0/24,NULL}'", "'{}'", "'{::/0}'", "'{10.0.0.0/8}'"),
        lossy=("'{{10.0.0.0/8},{10.1.0.0/16}}'", [None, None]),
        declared="array<string>",
    ),
    Col(
        "a_macaddr",
        "macaddr[]",
        "text",
        ("'{08:00:2b:01:02:03,NULL}'", "'{}'", "'{ff:ff:ff:ff:ff:ff}'", "'{08:00:2b:01:02:04}'"),
        lossy=("'{{08:00:2b:01:02:03},{08:00:2b:01:02:04}}'", [None, None]),
        declared="array<string>",
    ),
    Col(
        "a_macaddr8",
        "macaddr8[]",
        "text",
        ("'{08:00:2b:01:02:03:04:05,NULL}'", "'{}'", "'{ff:ff:ff:ff:ff:ff:ff:ff}'", "'{08:00:2b:01:02:03:04:06}'"),
        lossy=("'{{08:00:2b:01:02:03:04:05},{08:00:2b:01:02:03:04:06}}'", [None, None]),
        declared="array<string>",
    ),
    Col("a_bit", "bit(3)[]", "always_null", ("'{101,NULL}'", "'{}'", "'{111}'", "'{010}'")),
    Col("a_varbit", "varbit[]", "absent", ("'{101,NULL,\"\"}'", "'{}'", "'{1111111100000000111}'", "'{1}'")),
    Col(
        "a_tsvector",
        "tsvector[]",
        "text",
        ("ARRAY['a fat cat'::tsvector, NULL]", "'{}'", "ARRAY[''::tsvector]", "ARRAY['b'::tsvector]"),
        lossy=("ARRAY[['a'::tsvector],['b'::tsvector]]", [None, None]),
        declared="array<string>",
    ),
    Col(
        "a_ltree",
        "ltree[]",
        "text",
        ("'{Top.Science,NULL}'", "'{}'", "'{\"\"}'", "'{a.b}'"),
        lossy=("'{{a},{b.c}}'", [None, None]),
        declared="array<string>",
    ),
    Col(
        "a_hstore",
        "hstore[]",
        "hstore",
        ("ARRAY['a=>1'::hstore, NULL]", "'{}'", "ARRAY[''::hstore]", "ARRAY['b=>2'::hstore]"),
        lossy=("ARRAY[['a=>1'::hstore],['b=>2'::hstore]]", [None, None]),
        declared="array<string>",
    ),
    Col(
        "a_int4range",
        "int4range[]",
        "text",
        ("'{\"[1,10)\",NULL,empty}'", "'{}'", "'{\"(,)\"}'", "'{\"[3,4)\"}'"),
        lossy=('\'{{"[1,2)"},{"[3,4)"}}\'', [None, None]),
        declared="array<string>",
    ),
    Col(
        "a_tstzrange",
        "tstzrange[]",
        "text",
        ("'{\"[2026-01-01Z,2026-02-01Z)\",NULL}'", "'{}'", "'{\"(,)\"}'", "'{empty}'"),
        lossy=("'{{empty},{empty}}'", [None, None]),
        declared="array<string>",
    ),
    Col("a_point", "point[]", "absent", ("'{\"(1.5,-2.25)\",NULL}'", "'{}'", "'{\"(0,0)\"}'", "'{\"(3,4)\"}'")),
    Col("a_box", "box[]", "absent", ("'{(1,1),(0,0);(2,2),(1,1)}'", "'{}'", "'{(0,0),(0,0)}'", "'{(4,4),(1,1)}'")),
    Col(
        "a_enum",
        "{mood}[]",
        "text",
        ("'{happy,NULL,sad}'", "'{}'", "'{ok}'", "'{sad}'"),
        lossy=("'{{ok,sad},{happy,ok}}'", [None, None]),
        declared="array<string>",
    ),
    Col("a_domain_int", "{positive}[]", "absent", ("'{1,NULL,3}'", "'{}'", "'{2147483647}'", "'{4}'")),
    # Postgres 15's pgoutput does not publish generated columns: only snapshot reads carry their value.
    Col("c_generated", "integer GENERATED ALWAYS AS (c_int4 / 2) STORED", "generated", (), declared="int"),
]


WRITABLE = [c for c in COLUMNS if c.kind != "generated"]
# Rows: 1-3 and 6-8 are snapshot reads (6: values beyond Spark's range, 7: values Debezium cannot send
# whole, 8: arrays it garbles), 4 a NULL row; streaming then inserts 5 and 9 (a date before year 1, which a
# stream sends whole: beyond Spark's range) and updates 4, 1 (to NULLs) and 2.
STREAMED_LAST = {1, 2, 4, 5, 9}
STREAMED_BC_DATE = "c_date"  # row 9's column holding its lossy value (a BC date)
SNAPSHOT_RECORDS, ALL_RECORDS = 7, 14  # then 5 changes and a delete with its tombstone


def _is_array(col: Col) -> bool:
    return col.pg_type.endswith("[]")


def _garbled(col: Col) -> bool:
    """Two dimensions of a text-like array reach Debezium as Java arrays: it sends their names as text."""
    return _is_array(col) and col.kind == "text"


def _literal(col: Col, row_id: int) -> str | None:
    """Row ``row_id``'s value of ``col`` as SQL (None: NULL)."""
    if row_id == 6:
        return col.beyond or col.values[0]
    if row_id == 9:
        return col.lossy[0] if col.name == STREAMED_BC_DATE else col.values[0]
    if row_id in (7, 8):
        return col.lossy[0] if col.lossy and _garbled(col) == (row_id == 8) else col.values[0]
    return None if row_id == 4 else col.values[{1: 0, 2: 1, 3: 2, 5: 3}[row_id]]


def type_names(table: str) -> dict[str, str]:
    return {
        "mood": f"shop.{table}_mood",
        "positive": f"shop.{table}_positive",
        "short_text": f"shop.{table}_short_text",
        "pair": f"shop.{table}_pair",
    }


def create_table(conn, table: str) -> None:
    """The matrix table ``shop.<table>`` (with its enum and domains), empty."""
    names = type_names(table)
    for extension in ("citext", "ltree", "hstore"):
        conn.execute(f"CREATE EXTENSION IF NOT EXISTS {extension}")
    conn.execute(f"CREATE TYPE {names['mood']} AS ENUM ('sad', 'ok', 'happy')")
    conn.execute(f"CREATE DOMAIN {names['positive']} AS integer CHECK (VALUE > 0)")
    conn.execute(f"CREATE DOMAIN {names['short_text']} AS varchar(10)")
    conn.execute(f"CREATE TYPE {names['pair']} AS (x integer, y text)")
    columns = ", ".join(f"{c.name} {c.pg_type.format(**names)}" for c in COLUMNS)
    conn.execute(f"CREATE TABLE shop.{table} (id integer PRIMARY KEY, {columns})")


def drop_table(conn, table: str) -> None:
    conn.execute(f"DROP TABLE IF EXISTS shop.{table}")
    for name in type_names(table).values():
        conn.execute(f"DROP TYPE IF EXISTS {name}")


def _value(table: str, col: Col, literal: str | None) -> str:
    return "NULL" if literal is None else f"({literal})::{col.pg_type.format(**type_names(table))}"


def insert_rows(conn, table: str, snapshot: bool) -> None:
    """Before the connectors (``snapshot``) rows 1-4 and 6-8; then, streamed, the changes to 5, 9, 4, 1 and
    2, and row 3's delete."""

    def insert(row_id: int) -> None:
        values = ", ".join(_value(table, c, _literal(c, row_id)) for c in WRITABLE)
        conn.execute(
            f"INSERT INTO shop.{table} (id, {', '.join(c.name for c in WRITABLE)}) VALUES ({row_id}, {values})"
        )

    def update(row_id: int, like: int) -> None:
        sets = ", ".join(f"{c.name} = {_value(table, c, _literal(c, like))}" for c in WRITABLE)
        conn.execute(f"UPDATE shop.{table} SET {sets} WHERE id = {row_id}")

    if snapshot:
        for row_id in (1, 2, 3, 4, 6, 7, 8):
            insert(row_id)
    else:
        insert(5)
        insert(9)
        update(4, like=2)
        update(1, like=4)  # all NULL
        update(2, like=5)
        conn.execute(f"DELETE FROM shop.{table} WHERE id = 3")


# The connector settings that change how values are encoded, each varied alone from connectors/postgres.json
# (decimal.handling.mode=precise, time.precision.mode=adaptive, binary.handling.mode=bytes,
# interval.handling.mode=numeric, hstore.handling.mode=json, JsonConverter with schemas); plus the values
# without schemas (the columns declared, decimals as text) and rows flattened by ExtractNewRecordState.
CASES = {
    "defaults": {},
    "decimal_string": {"decimal.handling.mode": "string"},
    "decimal_double": {"decimal.handling.mode": "double"},
    "time_adaptive_time_microseconds": {"time.precision.mode": "adaptive_time_microseconds"},
    "time_connect": {"time.precision.mode": "connect"},
    "binary_base64": {"binary.handling.mode": "base64"},
    "binary_base64_url_safe": {"binary.handling.mode": "base64-url-safe"},
    "binary_hex": {"binary.handling.mode": "hex"},
    "interval_string": {"interval.handling.mode": "string"},
    "hstore_map": {"hstore.handling.mode": "map"},
    "schemaless": {
        "key.converter.schemas.enable": "false",
        "value.converter.schemas.enable": "false",
        "decimal.handling.mode": "string",
    },
    "flattened": {
        "transforms": "unwrap",
        "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
        "transforms.unwrap.add.fields": "op,lsn,source.ts_ms",
        "transforms.unwrap.delete.tombstone.handling.mode": "rewrite-with-tombstone",
    },
}
PRECISE_DECIMALS = set(CASES) - {"decimal_string", "decimal_double", "schemaless"}
# The kinds of column a setting changes: its connector captures only those (column.include.list), which
# keeps the matrix quick; defaults, schemaless and flattened capture every column.
CASE_KINDS = {
    "decimal_string": {"decimal", "money"},
    "decimal_double": {"decimal", "money"},
    "time_adaptive_time_microseconds": {"date", "time", "timetz", "timestamp", "timestamptz"},
    "time_connect": {"date", "time", "timetz", "timestamp", "timestamptz"},
    "binary_base64": {"bytes"},
    "binary_base64_url_safe": {"bytes"},
    "binary_hex": {"bytes"},
    "interval_string": {"interval"},
    "hstore_map": {"hstore"},
}
# The rows each case quarantines: 6 holds values beyond Spark's range, 8 arrays Debezium garbles, 9 a
# streamed date before year 1.
QUARANTINED = {case: {6, 8, 9} for case in ("defaults", "schemaless", "flattened")} | {
    "time_adaptive_time_microseconds": {6, 9},
    "time_connect": {6, 9},
}


# How each kind of column is compared: the SQL that reads an element from Postgres, the Spark SQL that
# reads it from the refined table (``{c}`` is the element), and the canonical Python form both are
# brought to (per case, as an encoding setting may make the refined value text or coarser).
_DAY_MICROS = 86_400_000_000
_TIME = re.compile(r"(\d\d):(\d\d):(\d\d)(?:\.(\d+))?(?:(Z)|([+-])(\d\d)(?::?(\d\d))?)?")
_INSTANT_MICROS = "CASE WHEN isfinite({c}) THEN extract(epoch from {c}) * 1000000 END"  # numeric: exact


def _special(number: float | Decimal) -> str | None:
    if number != number:
        return "NaN"
    if number in (float("inf"), Decimal("Infinity")):
        return "Infinity"
    if number in (float("-inf"), Decimal("-Infinity")):
        return "-Infinity"
    return None


def _float(value, case: str):
    return _special(float(value)) or float(value)


# decimal.handling.mode=string writes a numeric's special values in Java's words.
_DEBEZIUM_SPECIALS = {"NAN": "NaN", "POSITIVE_INFINITY": "Infinity", "NEGATIVE_INFINITY": "-Infinity"}


def _decimal(value, case: str):
    """Decimals by value (12.30 is 12.3); with decimal.handling.mode=double, as doubles."""
    if case == "decimal_double":
        return _float(value, case)
    number = Decimal(_DEBEZIUM_SPECIALS.get(str(value), str(value)))
    return _special(number) or format(number.normalize(), "f")


def _time_micros(value, case: str) -> int:
    """``HH:MM:SS[.ffffff][zone]`` as microseconds of the day in UTC (to the millisecond with
    time.precision.mode=connect)."""
    hours, minutes, seconds, fraction, _utc, sign, zone_hours, zone_minutes = _TIME.fullmatch(value).groups()
    micros = ((int(hours) * 60 + int(minutes)) * 60 + int(seconds)) * 1_000_000 + int(
        (fraction or "0").ljust(6, "0")[:6]
    )
    if sign:
        offset = (int(zone_hours) * 60 + int(zone_minutes or 0)) * 60_000_000
        micros = (micros - offset if sign == "+" else micros + offset) % _DAY_MICROS
    return micros - micros % 1000 if case == "time_connect" else micros


def _instant(value, case: str) -> int:
    """Microseconds since the epoch (to the millisecond, rounded down, with time.precision.mode=connect)."""
    micros = int(value)
    return micros - micros % 1000 if case == "time_connect" else micros


_ISO_INTERVAL = re.compile(r"P(?:(-?\d+)Y)?(?:(-?\d+)M)?(?:(-?\d+)D)?(?:T(?:(-?\d+)H)?(?:(-?\d+)M)?(?:(-?[\d.]+)S)?)?")


def _interval(value, case: str):
    """interval.handling.mode=numeric: Debezium's microseconds, with a month of 365.25 / 12 days
    (Postgres' parts turned into them as Debezium does); string mode: ISO 8601 text (Debezium writes
    every part, P0Y0M-3DT0H0M0S, Postgres' iso_8601 style only those not zero, P-3D), as (months, days,
    seconds)."""
    if case == "interval_string":
        years, months, days, hours, minutes, seconds = (
            Decimal(part or 0) for part in _ISO_INTERVAL.fullmatch(value).groups()
        )
        return (years * 12 + months, days, (hours * 60 + minutes) * 60 + seconds)
    if isinstance(value, int):
        return value
    years, months, days, seconds = json.loads(value)
    total_days = (years * 12 + months) * 30.4375 + days
    return int((total_days * 86400 + float(seconds)) * 1e6)


def _bytes(value, case: str) -> bytes:
    if isinstance(value, str):
        if case == "binary_base64_url_safe":
            return base64.urlsafe_b64decode(value)
        return base64.b64decode(value, validate=True) if case == "binary_base64" else bytes.fromhex(value)
    return bytes(value)


def _hstore(value, case: str) -> dict:
    return json.loads(value) if isinstance(value, str) else dict(value)


def _same(value, case: str):
    return value


class Kind(NamedTuple):
    postgres: str
    refined: str
    canonical: Callable


KINDS = {
    "int": Kind("{c}", "{c}", _same),
    "plain": Kind("{c}", "{c}", _same),
    "generated": Kind("{c}", "{c}", _same),
    "float4": Kind("{c}::float8", "CAST({c} AS DOUBLE)", _float),  # a real's own value, widened
    "float": Kind("{c}", "{c}", _float),
    "decimal": Kind("{c}", "{c}", _decimal),
    "money": Kind("{c}::numeric", "{c}", _decimal),
    "text": Kind("format('%s', {c})", "{c}", _same),  # the type's output (text(inet) would add /32)
    "bytes": Kind("{c}", "{c}", _bytes),
    "date": Kind("CASE WHEN isfinite({c}) THEN {c} - DATE '1970-01-01' END", "date_diff({c}, DATE'1970-01-01')", _same),
    "time": Kind("{c}::text", "{c}", _time_micros),
    "timetz": Kind("{c}::text", "{c}", _time_micros),
    "timestamp": Kind(_INSTANT_MICROS, "unix_micros(CAST({c} AS TIMESTAMP))", _instant),
    "timestamptz": Kind(_INSTANT_MICROS, "unix_micros({c})", _same),
    "interval": Kind(
        "json_build_array(extract(year from {c}), extract(month from {c}), extract(day from {c}), "
        "extract(epoch from {c} - date_trunc('day', {c})))::text",
        "{c}",
        _interval,
    ),
    "bit1": Kind("{c} = B'1'", "{c}", _same),
    "bits": Kind("{c}::text", "{c}", _same),
    # Debezium sends a varbit as the bits' integer, without its length: leading zeros are lost.
    "varbit": Kind("ltrim({c}::text, '0')", "{c}", _same),
    "hstore": Kind("hstore_to_json({c})::text", "{c}", _hstore),
    "point": Kind("ARRAY[{c}[0], {c}[1]]", "CASE WHEN {c} IS NOT NULL THEN array({c}.x, {c}.y) END", _same),
    "always_null": Kind("{c}::text", "{c}", _same),
}


def _postgres_sql(col: Col, case: str) -> str:
    element = KINDS[col.kind].postgres
    if col.kind == "interval" and case == "interval_string":
        element = "{c}::text"  # the session's intervalstyle is iso_8601
    if _is_array(col):
        inner = f"CASE WHEN x IS NOT NULL THEN {element.format(c='x')} END"  # format('%s', NULL) is ''
        return (
            f"CASE WHEN {col.name} IS NULL THEN NULL ELSE ARRAY(SELECT {inner} FROM unnest({col.name}) "
            f"WITH ORDINALITY AS u(x, n) ORDER BY n) END"
        )
    return f"CASE WHEN {col.name} IS NULL THEN NULL ELSE {element.format(c=col.name)} END"


def _refined_sql(col: Col) -> str:
    element = KINDS[col.kind].refined
    if _is_array(col) and element != "{c}":
        return f"transform(`{col.name}`, x -> {element.format(c='x')})"
    return element.format(c=f"`{col.name}`")


def _canonical(col: Col, value, case: str):
    if value is None:
        return None
    if isinstance(value, list):
        return [_canonical(col, item, case) for item in value]
    return KINDS[col.kind].canonical(value, case)


def compared(case: str) -> list[Col]:
    """The columns the refined table has (Debezium does not capture the ``absent`` kinds): the case's
    (CASE_KINDS); without schemas, the declared ones."""
    kinds = CASE_KINDS.get(case)
    return [
        c
        for c in COLUMNS
        if c.kind != "absent" and (case != "schemaless" or c.declared) and (kinds is None or c.kind in kinds)
    ]


# --- the refined Spark types, as docs/reference/postgres-types.md states them ----------------------------
# The page is the one statement of which Spark type each Postgres type refines to: the matrix reads the
# type each column must have from its table, and checks the refined table against it.

TYPES_PAGE = Path(__file__).parents[2] / "docs" / "reference" / "postgres-types.md"
# The setting a case varies, as the page's setting column names it; the other cases take the rows of
# the defaults ("any", "(default)", "precise", "adaptive...", "with schemas").
CASE_SETTING = {
    "decimal_string": "decimal.handling.mode=string",
    "decimal_double": "decimal.handling.mode=double",
    "time_adaptive_time_microseconds": "adaptive_time_microseconds",
    "time_connect": "connect",
    "binary_base64": "base64",
    "binary_base64_url_safe": "base64-url-safe",
    "binary_hex": "hex",
    "interval_string": "string",
    "hstore_map": "map",
}


class PageRow(NamedTuple):
    types: str  # the first cell: the Postgres types the row names
    setting: str
    spark: str


def page_rows() -> list[PageRow]:
    rows = []
    for line in TYPES_PAGE.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 4 and not line.startswith(("| ---", "| Postgres type")):
            rows.append(PageRow(*cells[:3]))
    return rows


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _page_type_name(pg_type: str) -> str:
    """How the page's first column names a matrix column's (element) type."""
    pg_type = re.sub(r"^integer GENERATED.*", "generated", pg_type)
    named = {"{mood}": "enums", "{positive}": "integer", "{short_text}": "text", "generated": "generated columns"}
    if pg_type in named:
        return named[pg_type]
    for pattern, name in [
        (r"char\(\d+\)", "char(n)"),
        (r"varchar\(\d+\)", "varchar"),
        (r"time(\(\d\))?", "time(p)"),
        (r"timestamp(\(\d\))?", "timestamp(p)"),
        (r"timestamptz(\(\d\))?", "timestamptz(p)"),
        (r"bit\((\d\d+|[2-9])\)", "bit(n)"),
    ]:
        if re.fullmatch(pattern, pg_type):
            return name
    return pg_type


def _names_row(row: PageRow, name: str, pg_type: str) -> bool:
    if not row.types.startswith("`numeric(p,s)`"):
        return name in _names(row.types) or (name in ("enums", "generated columns") and name in row.types)
    numeric = re.fullmatch(r"numeric\((\d+),(-?\d+)\)", pg_type)
    if numeric is None:
        return False
    precision, scale = map(int, numeric.groups())
    condition = row.types.split(",", 2)[-1]
    return {
        " 0 ≤ s ≤ p ≤ 38": 0 <= scale <= precision <= 38,
        " s > p (Postgres 15)": 0 <= precision < scale <= 38,
        " p > 38, s ≤ 38": precision > 38 and 0 <= scale <= 38,
        " s < 0 (Postgres 15) or s > 38": scale < 0 or scale > 38,
    }.get(condition, False)


def _applies(row: PageRow, case: str) -> bool:
    if row.setting == "any":
        return True
    if case in CASE_SETTING:
        return CASE_SETTING[case] in row.setting
    return (
        "(default)" in row.setting or row.setting in ("precise", "with schemas") or row.setting.startswith("adaptive")
    )


def documented_type(pg_type: str, case: str) -> str:
    """The Spark type (as Spark's simpleString, without spaces) the page gives a column of ``pg_type``
    under ``case``'s connector settings; an AssertionError when the page names none or several."""
    if pg_type.endswith("[]"):
        named = f"{_page_type_name(pg_type[:-2])}[]"  # an array type with a row of its own
        own = [row for row in page_rows() if named in _names(row.types) and _applies(row, case)]
        if own:
            return _names(own[0].spark)[0]
        (row,) = [row for row in page_rows() if row.types.startswith("arrays of")]
        assert row.spark == "`array<element type>`", row
        return f"array<{documented_type(pg_type[:-2], case)}>"
    name = _page_type_name(pg_type)
    if name.startswith("numeric") or name == "money":  # also the rows of every numeric and money
        name_rows = [row for row in page_rows() if _names_row(row, name, pg_type) or row.types == "`numeric`, `money`"]
        name_rows = [row for row in name_rows if row.types != "`numeric`, `money`" or case in CASE_SETTING]
    else:
        name_rows = [row for row in page_rows() if _names_row(row, name, pg_type)]
    rows = [row for row in name_rows if _applies(row, case)]
    assert len(rows) == 1, f"{pg_type} ({case}): the types page gives {len(rows)} rows: {rows}"
    (row,) = rows
    if row.spark == "the column's type":
        return "int"  # the matrix's generated column is an integer
    spark = _names(row.spark)
    names = _names(row.types)
    types = re.split(r" / |, ", row.spark) if len(_names(row.spark)) > 1 and len(names) > 1 else [row.spark]
    chosen = _names(types[names.index(name)])[0] if len(types) > 1 else spark[0]
    numeric = re.fullmatch(r"numeric\((\d+),(-?\d+)\)", pg_type)
    if numeric:
        chosen = chosen.replace("p,s", f"{numeric[1]},{numeric[2]}").replace("s,s", f"{numeric[2]},{numeric[2]}")
        chosen = chosen.replace("38,s", f"38,{numeric[2]}")
    return chosen.replace(" ", "")


def test_the_types_page_gives_each_matrix_column_one_refined_type():
    """Stack-free: every column the matrix refines, under every case but the declared (schemaless) one,
    has exactly one row of the types page."""
    documented = {(c.name, case): documented_type(c.pg_type, case) for case in CASES for c in compared(case)}
    assert documented[("c_num_10_2", "defaults")] == "decimal(10,2)"
    assert documented[("c_int2", "defaults")] == "smallint"
    assert documented[("a_int4", "defaults")] == "array<int>"


def source_cells(dsn: str, table: str, case: str) -> dict[int, dict]:
    """Postgres' rows, each column in its canonical form."""
    columns = compared(case)
    with psycopg.connect(dsn) as conn:
        conn.execute("SET intervalstyle = 'iso_8601'")
        rows = conn.execute(
            f"SELECT id, {', '.join(_postgres_sql(c, case) for c in columns)} FROM shop.{table}"
        ).fetchall()
    return {
        row[0]: {c.name: _canonical(c, value, case) for c, value in zip(columns, row[1:], strict=False)} for row in rows
    }


# Arrays Debezium sends as NULL when an element is NULL.
NULL_WITH_A_NULL_ELEMENT = {"a_tsvector", "a_ltree", "a_enum"}
# Columns whose streamed inserts and updates Debezium sends as NULL (snapshot reads carry the value).
NULL_WHEN_STREAMED = {"c_name"}


def expected_cells(dsn: str, table: str, case: str) -> dict[int, dict]:
    """The refined rows that must be: Postgres' own, less what Debezium cannot send (listed here, each a
    documented limit), and without the rows that must be in the quarantine."""
    expected = {
        row_id: row for row_id, row in source_cells(dsn, table, case).items() if row_id not in QUARANTINED.get(case, ())
    }
    for col in compared(case):
        if col.lossy and not _garbled(col):
            expected[7][col.name] = col.lossy[1]  # arrays of two dimensions; a BC date read by a snapshot
        if col.kind in ("time", "timetz") and _is_array(
            col
        ):  # Debezium keeps milliseconds of time[], seconds of timetz[]
            unit = 1000 if col.kind == "time" else 1_000_000
            for row in expected.values():
                row[col.name] = row[col.name] and [None if t is None else t - t % unit for t in row[col.name]]
        if col.name in NULL_WITH_A_NULL_ELEMENT:  # Debezium sends NULL for the whole array
            for row in expected.values():
                if row[col.name] and None in row[col.name]:
                    row[col.name] = None
        if col.kind == "always_null":  # bit(n)[]: Debezium's schema says Bits, and it sends NULL
            for row in expected.values():
                row[col.name] = None
        if col.kind == "generated" or col.name in NULL_WHEN_STREAMED:
            for row_id in STREAMED_LAST & set(expected):
                expected[row_id][col.name] = None
        if col.kind == "decimal" and case in PRECISE_DECIMALS:  # no NaN or infinity in a decimal: Debezium sends NULL
            for row in expected.values():
                if row[col.name] in ("NaN", "Infinity", "-Infinity"):
                    row[col.name] = None
    return expected


def refined_cells(table, case: str) -> dict[int, dict]:
    columns = compared(case)
    rows = table.selectExpr("id", *[f"{_refined_sql(c)} AS `{c.name}`" for c in columns]).collect()
    return {row["id"]: {c.name: _canonical(c, row[c.name], case) for c in columns} for row in rows}


def record_id(raw_value: str) -> int:
    value = json.loads(raw_value)
    row = value.get("payload", value)
    return row["after"]["id"] if "after" in row else row["id"]


class Matrix(NamedTuple):
    table: str
    topics: dict[str, str]


def _wait_for_records(kafka, topic: str, count: int, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while len(kafka.records(topic)) < count:
        assert time.monotonic() < deadline, f"{topic}: fewer than {count} records"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def matrix(stack, stack_config, kafka):
    """The matrix table, snapshotted then changed while streaming, captured by one connector per case."""
    table = f"m{uuid.uuid4().hex[:8]}"
    dsn = stack_config.postgres.dsn()
    client = ConnectClient(stack_config.connect.url)
    shipped = definitions.load("postgres")
    connectors = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        create_table(conn, table)
        insert_rows(conn, table, snapshot=True)
    try:
        for case, settings in CASES.items():
            name = f"{table}_{case}"
            columns = (
                {"column.include.list": f"shop\\.{table}\\.(id|{'|'.join(c.name for c in compared(case))})"}
                if case in CASE_KINDS
                else {}
            )
            connectors[case] = ConnectorDefinition(
                name,
                {
                    **shipped.config,
                    "topic.prefix": name,
                    "slot.name": name,
                    "publication.name": name,
                    "table.include.list": f"shop.{table}",
                    **columns,
                    **settings,
                },
            )
            client.register(connectors[case])
        topics = {case: f"{connector.name}.shop.{table}" for case, connector in connectors.items()}
        for case, connector in connectors.items():
            client.wait_running(connector.name)
            _wait_for_records(kafka, topics[case], SNAPSHOT_RECORDS)
        with psycopg.connect(dsn, autocommit=True) as conn:
            insert_rows(conn, table, snapshot=False)
        for topic in topics.values():
            _wait_for_records(kafka, topic, ALL_RECORDS)
        yield Matrix(table, topics)
    finally:
        for connector in connectors.values():
            remove_connector(stack_config, connector)
        with psycopg.connect(dsn, autocommit=True) as conn:
            drop_table(conn, table)


@pytest.mark.parametrize("case", CASES)
def test_every_cell_of_the_refined_table_equals_postgres(
    case, matrix, stack_config, spark, land, refine, refined_table, tmp_path
):
    """Snapshot reads and streamed changes of every column type, refined in one batch and then again
    (a rerun changes nothing): each column has the Spark type docs/reference/postgres-types.md gives it,
    each cell equals Postgres' value, compared in the canonical form of its kind (KINDS); the row whose
    values Spark cannot hold is in the quarantine, naming such a column."""
    topic, warehouse = matrix.topics[case], str(tmp_path)
    settings = {}
    if case == "schemaless":
        settings = {"columns": {"id": "int", **{c.name: c.declared for c in compared(case)}}, "key": ["id"]}
    expected = expected_cells(stack_config.postgres.dsn(), matrix.table, case)
    for _ in range(2):
        land(warehouse, topic)
        refine(warehouse, topic, **settings)
        refined = refined_cells(refined_table(warehouse, topic), case)
        assert sorted(refined) == sorted(expected)
        if case != "schemaless":  # (whose types are the ones the test declares)
            held = {f.name: f.dataType.simpleString() for f in refined_table(warehouse, topic).schema}
            wrong_types = {
                c.name: (held.get(c.name), documented)
                for c in compared(case)
                if held.get(c.name) != (documented := documented_type(c.pg_type, case))
            }
            assert not wrong_types, f"column: (refined type, the types page's): {wrong_types}"
        mismatches = {
            (row_id, name): (value, expected[row_id][name])
            for row_id, row in refined.items()
            for name, value in row.items()
            if value != expected[row_id][name]
        }
        assert not mismatches, f"(row, column): (refined, expected): {mismatches}"
        absent = {c.name for c in COLUMNS if c.kind == "absent"} & set(refined_table(warehouse, topic).columns)
        assert not absent, f"columns Debezium does not capture are in the table: {absent}"
        quarantined = {}
        if QUARANTINED.get(case):
            records = (
                spark.read.format("delta").load(quarantine_location(warehouse)).where(f"topic = '{topic}'").collect()
            )
            quarantined = {record_id(q.raw_value): q.reason for q in records}
            # each once, after the rerun too
            assert sorted(record_id(q.raw_value) for q in records) == sorted(quarantined), quarantined
        assert set(quarantined) == QUARANTINED.get(case, set()), quarantined
        for row_id, reason in quarantined.items():  # the reason names a column of the row's kind
            named = re.fullmatch(r"field (?:after\.)?(\w+): cannot decode the value as .+", reason)
            columns = (
                {STREAMED_BC_DATE}
                if row_id == 9
                else {c.name for c in COLUMNS if (c.beyond if row_id == 6 else c.lossy and _garbled(c))}
            )
            assert named, reason
            assert named[1] in columns, reason
