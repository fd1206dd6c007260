#!/bin/sh
# Runs once, when the postgres container initialises an empty data directory (docker-entrypoint-initdb.d).
# The API must not connect as a superuser: user SQL runs as the login role scalebook_reader (SELECT on
# runs only), and a superuser service could be talked into leaving it. So the service gets its own
# role `scalebook`: LOGIN, CREATEROLE (to create and manage scalebook_reader in `scalebook db upgrade`),
# not SUPERUSER, owner of the scalebook database.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
     -v pw="$SCALEBOOK_DB_PASSWORD" <<'EOSQL'
CREATE ROLE scalebook LOGIN CREATEROLE NOSUPERUSER NOCREATEDB PASSWORD :'pw';
ALTER DATABASE scalebook OWNER TO scalebook;
ALTER SCHEMA public OWNER TO scalebook;
EOSQL
