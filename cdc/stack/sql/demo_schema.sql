-- The demo database's sample schema: the column types Debezium encodes specially, a composite key,
-- an enum, a TOASTed column and a table without a primary key. Idempotent: safe to apply twice.
CREATE SCHEMA IF NOT EXISTS shop;

DO $$ BEGIN
    CREATE TYPE shop.order_status AS ENUM ('pending', 'paid', 'shipped', 'cancelled');
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

CREATE TABLE IF NOT EXISTS shop.customers (
    id           bigint PRIMARY KEY,
    email        text NOT NULL,
    full_name    text,
    balance      numeric(12, 2),        -- Debezium: Decimal, scale 2 in the schema
    credit_limit numeric,               -- unconstrained: VariableScaleDecimal {scale, value}
    signed_up_at timestamptz NOT NULL,  -- ZonedTimestamp, an ISO string in UTC
    birth_date   date,                  -- Date, days since the epoch
    profile      jsonb,                 -- Json, the JSON text (nested objects and arrays)
    tags         text[],
    external_id  uuid,
    is_active    boolean NOT NULL DEFAULT true,
    notes        text,                  -- large: stored out of line (TOAST)
    avatar       bytea
);
-- EXTERNAL: out of line and uncompressed, so every large note is TOASTed and an update that leaves
-- it alone makes Debezium send its unavailable-value placeholder.
ALTER TABLE shop.customers ALTER COLUMN notes SET STORAGE EXTERNAL;

CREATE TABLE IF NOT EXISTS shop.orders (
    customer_id bigint NOT NULL,
    order_no    integer NOT NULL,
    status      shop.order_status NOT NULL DEFAULT 'pending',
    amount      numeric(10, 2) NOT NULL,
    ordered_at  timestamp NOT NULL,     -- MicroTimestamp, no zone
    PRIMARY KEY (customer_id, order_no)
);

-- No primary key: Postgres needs REPLICA IDENTITY FULL to publish its updates and deletes, and
-- Debezium then sends null Kafka keys and the whole old row in `before`.
CREATE TABLE IF NOT EXISTS shop.page_views (
    customer_id bigint,
    url         text NOT NULL,
    viewed_at   timestamptz NOT NULL
);
ALTER TABLE shop.page_views REPLICA IDENTITY FULL;
