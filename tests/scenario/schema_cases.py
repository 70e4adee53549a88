"""schema_cases.py — the JSON-schema test set (tests/json_schema/cases.json) as the typed-reply
scenario test and benchmark run it: the cases, the sampling modes each case runs in, a SQL
literal quoter and a validator (python3-jsonschema, Debian's package)."""
import json
import os
import sys

try:
    import jsonschema
except ImportError:                                 # Debian's package, for another interpreter
    sys.path.append("/usr/lib/python3/dist-packages")
    import jsonschema

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = json.load(open(os.path.join(ROOT, "tests", "json_schema", "cases.json")))
# greedy, then sampled with two seeds
MODES = [("greedy", {"temperature": 0}), ("seed 1", {"temperature": 0.8, "seed": 1}),
         ("seed 2", {"temperature": 0.8, "seed": 2})]


def quote(text):
    """text as a SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def validate(schema, instance):
    """None when instance is valid, else why not."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    errors = sorted(cls(schema).iter_errors(instance), key=str)
    return str(errors[0].message) if errors else None
