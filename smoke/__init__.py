"""In-image smoke suite: `cd /opt/torch-images && python -m smoke`.

Stdlib only in the parent process (`smoke.runner`); each check runs in its own subprocess
(`python -m smoke.check NAME`), which is the only place torch is imported.
"""

SCHEMA_VERSION = 1
__version__ = "0.1.0"

# Statuses, shared by the runner and the checks.
PASS = "pass"
FAIL = "fail"
SKIP = "skip"
SUBSTITUTED = "substituted"
DEGRADED = "degraded"
ERROR = "error"
STATUSES = (PASS, FAIL, SKIP, SUBSTITUTED, DEGRADED, ERROR)
OK_STATUSES = frozenset({PASS, SKIP, SUBSTITUTED, DEGRADED})
