"""Whole-database sources: a pattern's topics become tables by template, with per-table keys; Debezium's
own topics never match; names that collide are refused."""

import re

import pytest

from cdc.core.errors import ConfigError
from cdc.pipeline.checks import expanded_pipeline, pipeline_problems
from cdc.pipeline.config import Pipeline, ScdType
from cdc.pipeline.database import INTERNAL_TOPIC, expanded, landing_pattern

TOPICS = [
    "demo.shop.customers",
    "demo.shop.orders",
    "demo.shop.audit_log",
    "demo.shop.Order Lines",
    "demo.billing.invoices",
    "demo.transaction",
    "__debezium-heartbeat.demo",
    "demo.shop.customers.dlq",
    "connect-offsets",
    "my-connect-configs",
    "dbz-signal",
    "events.clicks",
]


def pipeline(**refined) -> Pipeline:
    return Pipeline(
        name="db",
        sources={
            "shop": {"kind": "debezium_postgres", "pattern": r"demo\..*", "exclude": [r"demo\.shop\.audit_.*"]},
            "clicks": {"kind": "events", "format": "json", "topic": "events.clicks"},
        },
        refined={"clicks": {"source": "clicks"}, **refined},
    )


def test_every_matching_topic_becomes_a_table_named_by_the_template_with_its_own_keys():
    declared = pipeline(
        shop={
            "source": "shop",
            "name_template": "{schema}_{table}",
            "name_prefix": "pg_",
            "deletes": "soft",
            "tables": {"customers": {"scd": 2, "explode": ["tags"]}, r".*\.(orders|invoices)": {"deletes": "hard"}},
        }
    )
    tables = expanded(declared, TOPICS)
    assert sorted(tables.refined) == [
        "clicks",
        "pg_billing_invoices",
        "pg_shop_Order_Lines",
        "pg_shop_customers",
        "pg_shop_orders",
    ]
    customers = tables.refined["pg_shop_customers"]
    assert (customers.scd, customers.explode, customers.deletes.value) == (ScdType.HISTORY, ["tags"], "soft")
    assert tables.refined["pg_shop_orders"].deletes.value == "hard"
    assert tables.refined["pg_billing_invoices"].deletes.value == "hard"
    assert tables.sources["pg_shop_customers"].topic == "demo.shop.customers"
    assert tables.refined["pg_shop_customers"].source == "pg_shop_customers"
    assert expanded(declared, []).refined.keys() == {"clicks"}  # nothing landed yet: no table


def test_debeziums_own_topics_and_exclusions_are_never_landed_or_refined():
    declared = pipeline(shop={"source": "shop"})
    landing = re.compile(landing_pattern(declared))
    landed = [topic for topic in TOPICS if landing.fullmatch(topic)]
    assert landed == [
        "demo.shop.customers",
        "demo.shop.orders",
        "demo.shop.Order Lines",
        "demo.billing.invoices",
        "events.clicks",
    ]
    for internal in ["demo.transaction", "__debezium-heartbeat.demo", "connect-status", "x.y.z-dlq", "dbz-signal"]:
        assert INTERNAL_TOPIC.fullmatch(internal), internal
    assert not INTERNAL_TOPIC.fullmatch("demo.shop.customers")


def test_two_topics_making_one_name_are_refused_naming_both():
    declared = pipeline(shop={"source": "shop"})  # {table}: shop.orders and billing.orders collide
    with pytest.raises(
        ConfigError, match=r"demo\.shop\.orders makes the table name 'orders'.*topic demo\.billing\.orders"
    ):
        expanded(declared, ["demo.shop.orders", "demo.billing.orders"])
    with pytest.raises(ConfigError, match=r"'clicks', which refined\.clicks has already"):
        expanded(declared, ["demo.shop.clicks"])


def test_validate_names_keys_a_pattern_table_cannot_have_and_sql_is_checked_once_the_tables_are_known(tmp_path):
    bad = Pipeline(
        name="db",
        sources={
            "one": {"kind": "debezium_postgres", "topic": "demo.shop.one"},
            "all": {"kind": "debezium_postgres", "pattern": r"demo\.shop\..*"},
        },
        refined={
            "one": {"source": "one", "name_prefix": "x_"},
            "all": {"source": "all", "name_template": "{schema}{nope}"},
        },
        business={"report": {"sql": "SELECT count(*) FROM customers"}},
    )
    problems = dict(pipeline_problems(bad, tmp_path))
    assert problems["refined.one.name_prefix"] == "applies to a source with a `pattern` only"
    assert "{nope} is not one of" in problems["refined.all.name_template"]
    assert "business.report.sql" not in problems  # `customers` may be one of the pattern's tables
    fine = bad.model_copy(update={"refined": {"all": bad.refined["all"].model_copy(update={"name_template": None})}})
    assert expanded_pipeline(fine, ["demo.shop.customers"]).refined.keys() == {"customers"}
    with pytest.raises(ConfigError, match=r"business\.report\.sql: unknown table 'customers'"):
        expanded_pipeline(fine, ["demo.shop.orders"])


def test_per_table_keys_are_checked_as_a_tables():
    with pytest.raises(ValueError, match=r"tables\.customers\.scd"):
        pipeline(shop={"source": "shop", "tables": {"customers": {"scd": 3}}})
    with pytest.raises(ValueError, match=r"tables\.customers\.source: not a key"):
        pipeline(shop={"source": "shop", "tables": {"customers": {"source": "clicks"}}})
    with pytest.raises(ValueError, match="give one of `topic`"):
        Pipeline(name="db", sources={"s": {"kind": "debezium_postgres", "topic": "a.b.c", "pattern": "a.*"}})


def test_tables_named_like_debeziums_own_topics_are_still_tables():
    for table_topic in [
        "demo.shop.signals",
        "demo.shop.heartbeat_log",
        "demo.public.dlq_items",
        "demo.public.transaction",
        "demo.hr.deadletter_notes",
        "demo.shop.orders_dlq",
    ]:
        assert not INTERNAL_TOPIC.fullmatch(table_topic), table_topic


def test_per_table_keys_merge_mappings_and_a_name_selects_only_that_table():
    declared = pipeline(
        shop={
            "source": "shop",
            "mask": {"email": "sha256"},
            "tables": {"shop.orders": {"mask": {"ssn": "sha256"}}, "orders_.*": {"deletes": "soft"}},
        }
    )
    tables = expanded(declared, ["demo.shop.orders", "demo.public.shop_orders", "demo.shop.orders_2026"])
    assert dict(tables.refined["orders"].mask) == {"email": "sha256", "ssn": "sha256"}  # the group's mask stays
    assert dict(tables.refined["shop_orders"].mask) == {"email": "sha256"}  # `shop.orders` is a name, not a regex
    assert tables.refined["orders_2026"].deletes.value == "soft"


def test_names_too_long_or_differing_in_case_only_and_bad_templates_are_refused(tmp_path):
    declared = pipeline(shop={"source": "shop"})
    with pytest.raises(ConfigError, match="longer than 128 characters"):
        expanded(declared, ["demo.shop." + "t" * 129])
    with pytest.raises(ConfigError, match="differing in case only collide"):
        expanded(declared, ["demo.shop.Orders", "demo.shop.orders"])
    bad = pipeline(shop={"source": "shop", "name_template": "{table"})
    assert "not a template" in dict(pipeline_problems(bad, tmp_path))["refined.shop.name_template"]
    with pytest.raises(ValueError, match=r"scope a flag"):
        Pipeline(name="db", sources={"s": {"kind": "debezium_postgres", "pattern": r"(?i)demo\..*"}})


def test_a_tables_keys_are_checked_where_the_file_gives_them(tmp_path):
    declared = pipeline(shop={"source": "shop", "tables": {"orders": {"split_by": "region"}}})
    problems = dict(pipeline_problems(declared, tmp_path))
    assert "applies to event sources only" in problems["refined.shop.tables.orders.split_by"]
    clashing = pipeline(
        shop={"source": "shop", "tables": {"orders": {"columns": ["id"]}, "ord.*": {"except_columns": ["x"]}}}
    )
    with pytest.raises(ConfigError, match=r"refined\.shop\.tables\.orders, refined\.shop\.tables\.ord\.\*: together"):
        expanded(clashing, ["demo.shop.orders"])
