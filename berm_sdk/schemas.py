"""A tool's ``parameters`` are a JSON Schema, which an agent reads to call the tool: ``berm build`` checks each
against the JSON Schema metaschema (draft 2020-12), so that a typo (``type = "strin"``, ``required = "name"``)
fails the build instead of reaching the agent (a newcomer's walkthrough: it was accepted without a word).
``jsonschema`` is imported on the first check (70 ms), not with the module: only builds check schemas."""

from __future__ import annotations


def schema_problem(parameters: dict) -> str | None:
    """What makes ``parameters`` no JSON Schema, with where in it; None when it is one."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(parameters)
    except SchemaError as exc:
        where = "/".join(map(str, exc.path))
        return exc.message + (f" (at {where})" if where else "")
    except RecursionError:  # jsonschema checks recursively: a `not` in a `not` 200 deep was a traceback (a review)
        return "it nests too deeply to be checked"
    return None
