-- Transactions in one session: rollback, savepoints, subtransactions, constraints, ON CONFLICT,
-- row locks, cursors and prepared transactions.
CREATE EXTENSION IF NOT EXISTS slipstream;
SET default_table_access_method = slipstream;

CREATE TABLE acct (id int PRIMARY KEY, owner text UNIQUE, balance numeric CHECK (balance >= 0));
INSERT INTO acct VALUES (1, 'ann', 100), (2, 'bob', 50), (3, 'cy', 0);

-- ROLLBACK undoes inserts, updates and deletes
BEGIN;
INSERT INTO acct VALUES (4, 'dee', 10);
UPDATE acct SET balance = balance - 10 WHERE id = 1;
DELETE FROM acct WHERE id = 3;
SELECT * FROM acct ORDER BY id;
ROLLBACK;
SELECT * FROM acct ORDER BY id;

-- Savepoints and subtransactions
BEGIN;
UPDATE acct SET balance = 90 WHERE id = 1;
SAVEPOINT a;
UPDATE acct SET balance = 80 WHERE id = 1;
DELETE FROM acct WHERE id = 2;
SAVEPOINT b;
INSERT INTO acct VALUES (5, 'eve', 5);
ROLLBACK TO SAVEPOINT a;
SELECT * FROM acct ORDER BY id;
UPDATE acct SET balance = balance + 1 WHERE id = 1;
RELEASE SAVEPOINT a;
COMMIT;
SELECT * FROM acct ORDER BY id;

-- A failing statement inside a subtransaction (PL/pgSQL exception block)
DO $$
BEGIN
  BEGIN
    UPDATE acct SET balance = balance - 1000 WHERE id = 2;
  EXCEPTION WHEN check_violation THEN
    RAISE NOTICE 'caught %', SQLERRM;
  END;
  UPDATE acct SET balance = balance + 1 WHERE id = 2;
END $$;
SELECT * FROM acct ORDER BY id;

-- The same row updated many times in one transaction (combo command ids)
BEGIN;
UPDATE acct SET balance = balance + 1 WHERE id = 3;
UPDATE acct SET balance = balance + 1 WHERE id = 3;
DELETE FROM acct WHERE id = 3;
INSERT INTO acct VALUES (3, 'cy', 7);
UPDATE acct SET balance = balance * 2 WHERE id = 3;
SELECT * FROM acct WHERE id = 3;
COMMIT;
SELECT * FROM acct ORDER BY id;

-- Foreign keys, with ON DELETE CASCADE and a deferred constraint
CREATE TABLE txn (id serial PRIMARY KEY, acct int REFERENCES acct ON DELETE CASCADE, amount numeric);
INSERT INTO txn (acct, amount) VALUES (1, 5), (1, 6), (2, 7);
INSERT INTO txn (acct, amount) VALUES (42, 1);
DELETE FROM acct WHERE id = 1;
SELECT acct, amount FROM txn ORDER BY id;
CREATE TABLE parent (id int PRIMARY KEY);
CREATE TABLE child (pid int REFERENCES parent DEFERRABLE INITIALLY DEFERRED);
BEGIN;
INSERT INTO child VALUES (1);
INSERT INTO parent VALUES (1);
COMMIT;
BEGIN;
INSERT INTO child VALUES (2);
COMMIT;
SELECT * FROM child;

-- INSERT ... ON CONFLICT (speculative insertion)
INSERT INTO acct VALUES (2, 'bob2', 1) ON CONFLICT (id) DO NOTHING;
INSERT INTO acct VALUES (2, 'bob', 1) ON CONFLICT (id) DO UPDATE SET balance = acct.balance + EXCLUDED.balance;
INSERT INTO acct VALUES (9, 'bob', 1) ON CONFLICT (owner) DO UPDATE SET balance = 0 RETURNING *;
INSERT INTO acct VALUES (10, 'zed', 3) ON CONFLICT DO NOTHING RETURNING id;
INSERT INTO acct SELECT g, 'u' || g, g FROM generate_series(10, 14) g
  ON CONFLICT (id) DO UPDATE SET balance = EXCLUDED.balance * 10;
SELECT * FROM acct ORDER BY id;
INSERT INTO acct VALUES (11, 'again', 1), (11, 'twice', 2) ON CONFLICT (id) DO UPDATE SET balance = 1;

-- Row locks in one session, and a cursor that sees its snapshot
BEGIN;
SELECT id FROM acct WHERE id = 2 FOR UPDATE;
SELECT id FROM acct WHERE id = 2 FOR NO KEY UPDATE;
SELECT id FROM acct WHERE id = 2 FOR SHARE;
SELECT id FROM acct WHERE id = 2 FOR KEY SHARE;
UPDATE acct SET balance = 77 WHERE id = 2;
SELECT id, balance FROM acct WHERE id = 2 FOR UPDATE NOWAIT;
SELECT id FROM acct WHERE id >= 10 ORDER BY id FOR UPDATE SKIP LOCKED;
COMMIT;
BEGIN;
DECLARE c CURSOR FOR SELECT id, balance FROM acct ORDER BY id;
FETCH 2 FROM c;
UPDATE acct SET balance = -1 + 1 WHERE id > 0;
FETCH ALL FROM c;
CLOSE c;
ROLLBACK;

-- REPEATABLE READ and SERIALIZABLE snapshots in one session
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT count(*) FROM acct;
INSERT INTO acct VALUES (20, 'rr', 1);
SELECT count(*) FROM acct;
COMMIT;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT sum(balance) FROM acct;
UPDATE acct SET balance = balance + 1 WHERE id = 20;
COMMIT;

-- Prepared transactions
BEGIN;
INSERT INTO acct VALUES (30, 'prepared', 3);
PREPARE TRANSACTION 'slipstream_p1';
SELECT count(*) FROM acct WHERE id = 30;
COMMIT PREPARED 'slipstream_p1';
SELECT * FROM acct WHERE id = 30;
BEGIN;
DELETE FROM acct WHERE id = 30;
PREPARE TRANSACTION 'slipstream_p2';
ROLLBACK PREPARED 'slipstream_p2';
SELECT * FROM acct WHERE id = 30;

SELECT check_name, ok FROM slipstream.verify('acct');
DROP TABLE child, parent, txn, acct;
