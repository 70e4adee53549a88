/* pg_cai_router--0.1--0.2.sql — upgrade of pg_cai_router from 0.1 to 0.2 */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "ALTER EXTENSION pg_cai_router UPDATE TO '0.2'" to load this file. \quit

--
-- pg_cai_router--0.1.sql is frozen: a fresh CREATE EXTENSION runs it and then this script.
-- Every change of 0.2 goes here.
--
