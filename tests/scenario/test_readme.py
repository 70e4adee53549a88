"""The README tells the truth.

1. Its SQL reference table against the catalog: every function the extension installs is in the
   table and every function in the table is installed; EXECUTE is never PUBLIC's, and cai_user
   has it unless the row's description begins with "superuser:" or "internal:"; the sentence
   about volatility, parallel safety and SECURITY INVOKER above the table holds for every
   function; the view is readable by cai_user.
2. Its examples that show an output: a ```sql block right after a line beginning with
   "<!-- checked" is run, statement by statement in one session, in a new database of a cluster
   with the default configuration (not the shared test cluster's numerics), and each statement
   whose line ends with "-- OUTPUT" (optionally followed by two spaces and a parenthesized remark)
   must print OUTPUT: one row, columns separated by "|" (spaces around it do not matter).
"""
import os
import re

from pgtest import DB, Checks, Cluster, ensure_database, psql, value

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
MODEL = os.environ.get("PG_CAI_TEST_MODEL",
                       os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
NOT_GRANTED = ("superuser:", "internal:")

c = Checks()


# ---- 1. the function table ---------------------------------------------------------------

def reference_table():
    """{function name: granted to cai_user (bool)}, the view names of the SQL reference, and the
    functions whose row says they are SECURITY DEFINER."""
    section = README.split("\n## SQL reference\n", 1)[1].split("\n## ", 1)[0]
    functions, views, definers = {}, set(), set()
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith("| function ") or line.startswith("|---"):
            continue
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        first, description = cells[0], cells[-1]
        view = re.match(r"view `(\w+)`", first)
        if view:
            views.add(view.group(1))
            continue
        granted = not description.startswith(NOT_GRANTED)
        for name in re.findall(r"`(cai_\w+)\(", first):
            functions[name] = granted
            if "`SECURITY DEFINER`" in description:
                definers.add(name)
    return functions, views, definers


ensure_database()
documented, documented_views, definers = reference_table()
rows = value("""
SELECT string_agg(format('%s %s %s %s %s %s', p.proname, p.provolatile, p.proparallel, p.prosecdef,
                         has_function_privilege('cai_user', p.oid, 'EXECUTE'),
                         EXISTS (SELECT FROM aclexplode(p.proacl) a WHERE a.grantee = 0)), E'\\n')
FROM pg_proc p
JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'pg_cai'""").splitlines()
catalog = {}
for row in rows:
    name, volatility, parallel, secdef, cai_user, public = row.split()
    catalog.setdefault(name, []).append((volatility, parallel, secdef == "t", cai_user == "t",
                                         public == "t"))

print("the README's table documents %d functions; the extension installs %d"
      % (len(documented), len(catalog)))
c.check("the SQL reference documents every installed function",
        not set(catalog) - set(documented), sorted(set(catalog) - set(documented)))
c.check("every function the SQL reference documents is installed",
        not set(documented) - set(catalog), sorted(set(documented) - set(catalog)))
wrong_grants = sorted(name for name, granted in documented.items() if name in catalog and
                      any(cai_user != granted for _, _, _, cai_user, _ in catalog[name]))
c.check("cai_user may execute exactly the functions the table grants it", not wrong_grants,
        ", ".join("%s (table: %s)" % (n, "granted" if documented[n] else "not granted")
                  for n in wrong_grants))
c.check("no function is executable through PUBLIC",
        not [n for n, props in catalog.items() if any(p[4] for p in props)],
        [n for n, props in catalog.items() if any(p[4] for p in props)])

claim = ("All functions are `PARALLEL UNSAFE` and `SECURITY INVOKER` (but the rows that say `SECURITY\n"
         "DEFINER`), and `VOLATILE` but for the two readers (`STABLE`)")
c.check("the README states the functions' properties", claim in README)
c.check("every function is PARALLEL UNSAFE",
        not [n for n, props in catalog.items() if any(p[1] != "u" for p in props)],
        [n for n, props in catalog.items() if any(p[1] != "u" for p in props)])
definers_installed = sorted(n for n, props in catalog.items() if any(p[2] for p in props))
c.check("every function is SECURITY INVOKER but those the table says are SECURITY DEFINER",
        definers_installed == sorted(definers), "installed: %s, documented: %s"
        % (definers_installed, sorted(definers)))
stable = sorted(n for n, props in catalog.items() if any(p[0] != "v" for p in props))
c.check("two functions, the readers, are STABLE and the others VOLATILE",
        stable == ["cai_conversations", "cai_history"] and
        all(p[0] == "s" for n in stable for p in catalog[n]), stable)
for view in sorted(documented_views):
    c.check("view %s exists and cai_user may read it" % view,
            value("SELECT has_table_privilege('cai_user', '%s', 'SELECT')" % view) == "t")


# ---- 2. the examples that show an output ------------------------------------------------

OUTPUT = re.compile(r";\s+-- (.*?)(?:\s{2,}\(.*\))?\s*$")


def checked_blocks():
    """The ```sql blocks right after a "<!-- checked" line, as lists of lines."""
    blocks = []
    lines = README.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("<!-- checked") and i + 1 < len(lines) and lines[i + 1] == "```sql":
            end = lines.index("```", i + 2)
            blocks.append(lines[i + 2:end])
    return blocks


def script_of(block):
    """The block as a psql script that prints a marker before and after each statement with an
    output comment; returns (script, [expected output])."""
    out, expected = [], []
    statement = []
    in_body = False
    for line in block:
        statement.append(line)
        if line.count("$$") % 2:
            in_body = not in_body
        if in_body:
            continue
        m = OUTPUT.search(line)
        if m:
            statement[-1] = line[:m.start() + 1]
            out.append("\\echo @@check %d" % len(expected))
            out.extend(statement)
            out.append("\\echo @@end")
            expected.append(m.group(1).strip())
            statement = []
        elif re.search(r";\s*(--.*)?$", line):
            out.extend(statement)
            statement = []
    out.extend(statement)
    return "\n".join(out) + "\n", expected


def outputs(text):
    """What was printed between each pair of markers."""
    got, current = [], None
    for line in text.splitlines():
        if line.startswith("@@check "):
            current = []
        elif line == "@@end" and current is not None:
            got.append("\n".join(current))
            current = None
        elif current is not None:
            current.append(line)
    return got


def fields(row):
    return [f.strip() for f in row.split("|")]


blocks = checked_blocks()
n_outputs = sum(len(script_of(b)[1]) for b in blocks)
c.check("the README marks examples with an output to check", blocks and n_outputs > 0,
        "%d blocks, %d outputs" % (len(blocks), n_outputs))

# the default configuration: no setting but the library, the model and where to listen
cluster = Cluster({"shared_preload_libraries": "'pg_cai'", "pg_cai.model": "'%s'" % MODEL,
                   "pg_cai.weight_rounding": "auto", "pg_cai.activation_precision": "auto"})
try:
    c.check("a cluster with the default configuration starts", cluster.start(), cluster.log)
    c.check("its engine is ready", cluster.wait_log("pg_cai engine worker ready", 300) is not None,
            cluster.log)
    for i, block in enumerate(blocks):
        db = "readme_%d" % i
        cluster.psql("CREATE DATABASE %s" % db)
        cluster.psql("CREATE EXTENSION pg_cai", db=db)
        script, expected = script_of(block)
        r = psql(script, db=db, env=cluster.env(), timeout=600)
        got = outputs(r.out)
        c.check("example %d runs" % (i + 1), r.rc == 0, repr(r))
        for j, want in enumerate(expected):
            have = got[j] if j < len(got) else None
            print("example %d, output %d: README %r, default configuration %r" % (i + 1, j + 1, want, have))
            c.check("example %d, output %d is what the default configuration gives" % (i + 1, j + 1),
                    have is not None and fields(have) == fields(want),
                    "README %r, got %r" % (want, have))
finally:
    cluster.stop()
    if not c.failed:
        cluster.remove()
c.done()
