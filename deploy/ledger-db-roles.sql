-- The prediction ledger's two roles (docs/deployment.md, "The ledger's roles"), run once by a
-- superuser connected to the ledger's database. compose's `ledger-db` runs it from
-- /docker-entrypoint-initdb.d when it creates the database; elsewhere:
--   LEDGER_SECRETS_DIR=DIR psql -v ON_ERROR_STOP=1 -U SUPERUSER -d LEDGER_DB -f ledger-db-roles.sql
-- The passwords are read from the files `ledger-owner-password` and `ledger-service-password` in
-- $LEDGER_SECRETS_DIR (default /run/secrets, where compose mounts its secrets).
--
--   medtpe_owner    owns the database and its schema: runs the migrations (`medtpe ledger
--                   upgrade`) and `medtpe outcomes`
--   medtpe_service  the service: SELECT and INSERT on the ledger's tables, those the migrations
--                   create later included; no UPDATE, DELETE or DDL
\set ON_ERROR_STOP on
\set owner_password `cat "${LEDGER_SECRETS_DIR:-/run/secrets}/ledger-owner-password"`
\set service_password `cat "${LEDGER_SECRETS_DIR:-/run/secrets}/ledger-service-password"`
SELECT :'owner_password' = '' OR :'service_password' = '' AS missing_password \gset
\if :missing_password
DO $$ BEGIN RAISE EXCEPTION 'ledger-owner-password or ledger-service-password is missing or empty'; END $$;
\endif

CREATE ROLE medtpe_owner LOGIN PASSWORD :'owner_password';
CREATE ROLE medtpe_service LOGIN PASSWORD :'service_password';

SELECT format('ALTER DATABASE %I OWNER TO medtpe_owner', current_database()) \gexec
SELECT format('REVOKE ALL ON DATABASE %I FROM PUBLIC', current_database()) \gexec
SELECT format('GRANT CONNECT ON DATABASE %I TO medtpe_service', current_database()) \gexec
ALTER SCHEMA public OWNER TO medtpe_owner;
REVOKE ALL ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO medtpe_service;

-- the tables the owner's migrations create from now on, and any already there
ALTER DEFAULT PRIVILEGES FOR ROLE medtpe_owner IN SCHEMA public
    GRANT SELECT, INSERT ON TABLES TO medtpe_service;
GRANT SELECT, INSERT ON ALL TABLES IN SCHEMA public TO medtpe_service;
