/* pg_cai--0.2--0.3.sql — upgrade of pg_cai from 0.2 to 0.3 (ALTER EXTENSION pg_cai UPDATE) */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "ALTER EXTENSION pg_cai UPDATE TO '0.3'" to load this file. \quit

--
-- pg_cai--0.1.sql and pg_cai--0.1--0.2.sql are frozen: a fresh CREATE EXTENSION runs them and
-- then this script, so a new database and an upgraded one get the same objects by the same
-- statements.  Every change of 0.3 goes here.
--
