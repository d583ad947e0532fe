"""A Celery client in the Celery virtualenv, driven by the tests over stdin/stdout: one
JSON object a line, ``{"code": "<python>"}``; the code runs with ``app``, ``celery``
(the package) and this module's tasks in scope and sets ``out`` to a JSON value. The
answer is ``{"ok": true, "out": ...}`` or ``{"ok": false, "error": "Type: message"}``.
Standard library and Celery only (it runs in Celery's virtualenv)."""

import json
import sys
import traceback

import celery
import celery_proj
from celery import chain, chord, group, signature

scope = {"app": celery_proj.app, "celery": celery, "chain": chain, "chord": chord,
         "group": group, "signature": signature, "proj": celery_proj}


def main():
    print(json.dumps({"ok": True, "out": "ready"}), flush=True)
    for line in sys.stdin:
        try:
            request = json.loads(line)
            local = dict(scope)
            exec(request["code"], local)
            answer = {"ok": True, "out": local.get("out")}
        except Exception as exc:
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                      "traceback": traceback.format_exc()}
        print(json.dumps(answer, default=repr), flush=True)


if __name__ == "__main__":
    main()
