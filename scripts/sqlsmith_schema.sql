-- The tables sqlsmith queries (scripts/sqlsmith.sh): every common type, NULLs, values of the
-- engine's small, medium and large classes and past TOAST's threshold, indexes of each kind,
-- a view and a partitioned table. Created twice, once with slipstream as the default access
-- method and once with heap, from the same deterministic data.
CREATE TABLE items (
  id int PRIMARY KEY, qty bigint, price numeric(12, 2), ratio float8, name text,
  code varchar(16), active bool, born date, seen timestamptz, doc jsonb, tags int[],
  blob bytea, ref uuid);
INSERT INTO items
SELECT i, CASE WHEN i % 7 = 0 THEN NULL ELSE i * 37 % 1000 END, (i * 13 % 10000) / 100.0,
       CASE WHEN i % 11 = 0 THEN NULL ELSE i / 7.0 END,
       CASE i % 4 WHEN 0 THEN 'n' || i WHEN 1 THEN repeat('m', 300) || i
                  WHEN 2 THEN repeat('L', 1500) || i ELSE repeat('t', 9000) || i END,
       'c' || (i % 50), i % 3 = 0, date '2020-01-01' + i % 1000,
       timestamptz '2024-01-01 00:00+00' + i * interval '17 minutes',
       jsonb_build_object('i', i, 'k', 'v' || (i % 9), 'a', jsonb_build_array(i, i + 1)),
       ARRAY[i % 10, i % 5], decode(md5(i::text), 'hex'),
       md5(i::text)::uuid
FROM generate_series(1, 2000) i;
CREATE INDEX items_qty ON items (qty);
CREATE UNIQUE INDEX items_code_id ON items (code, id);
CREATE INDEX items_lower_name ON items (lower(left(name, 20)));
CREATE INDEX items_active ON items (born) WHERE active;
CREATE INDEX items_doc ON items USING gin (doc);
CREATE INDEX items_seen ON items USING brin (seen);
CREATE INDEX items_ref ON items USING hash (ref);

CREATE TABLE orders (
  id bigserial PRIMARY KEY, item int REFERENCES items, amount int NOT NULL,
  note text, at timestamp);
INSERT INTO orders (item, amount, note, at)
SELECT 1 + i % 2000, i % 97, CASE WHEN i % 5 = 0 THEN NULL ELSE 'order ' || i END,
       timestamp '2024-06-01' + i * interval '1 minute'
FROM generate_series(1, 5000) i;
CREATE INDEX orders_item ON orders (item, amount);

CREATE TABLE empty_t (a int, b text);
CREATE TABLE events (id int, kind text, at date) PARTITION BY RANGE (at);
CREATE TABLE events_2023 PARTITION OF events FOR VALUES FROM ('2023-01-01') TO ('2024-01-01');
CREATE TABLE events_2024 PARTITION OF events FOR VALUES FROM ('2024-01-01') TO ('2025-01-01');
INSERT INTO events SELECT i, 'k' || (i % 4), date '2023-01-01' + i % 700 FROM generate_series(1, 3000) i;
CREATE VIEW item_orders AS
  SELECT i.id, i.name, o.amount, o.at FROM items i JOIN orders o ON o.item = i.id;
ANALYZE items, orders, empty_t, events;
