"""Which lines of spark-submit's own output reach the task log when Spark's logging is quiet.

log4j's level (``spark.log4j``) does not reach two sources of lines: Ivy, which prints the
resolution of ``spark.jars.packages`` (Delta's jars when ``PGLOGREPL_DELTA_JARS`` is unset) as
some ninety lines of modules found and retrieved on every run, and the JVM's own start-up notice
of incubator modules. At a quiet level these become one line that says what happened and how to
skip it; anything else Ivy prints (an unresolved dependency, a download failure) passes through,
and so does everything at ``INFO`` and below.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Ivy's report starts with one of these ...
_IVY_START = re.compile(r"^(?::: loading settings :: |Ivy Default Cache set to: )")
# ... goes on with these lines when the resolution works (found, report, retrieval) ...
_IVY_ROUTINE = re.compile(
    r"^(?:Ivy Default Cache set to: "
    r"|The jars for the packages stored in: "
    r"|\S+#\S+ added as a dependency$"
    r"|:: resolving dependencies :: "
    r"|confs: \[\w+\]$"
    r"|found \S+ in \S+$"
    r"|downloading \S+ \.\.\.$"
    r"|\[SUCCESSFUL \] "
    r"|:: resolution report :: "
    r"|:: modules in use:$"
    r"|:: evicted modules:$"
    r"|\S+#\S+ (?:from \S+ in|by \[\S+\] in) \[\w+\]$"
    r"|-+$"
    r"|\|.*\|$"
    r"|:: retrieving :: )"
)
_IVY_DONE = re.compile(r"^(\d+) artifacts copied, (\d+) already retrieved")
_JVM_NOTICE = re.compile(r"^WARNING: Using incubator modules: ")


@dataclass
class QuietSubmitOutput:
    """Decides line by line (``keep``) what of spark-submit's output the task log shows, and
    says in one line (``ivy_summary``) what Ivy did when its lines were held back."""

    held: int = 0
    summarized: bool = False  # whether ivy_summary was logged
    _in_ivy: bool = field(default=False, repr=False)
    _copied: int = field(default=0, repr=False)
    _retrieved: int = field(default=0, repr=False)

    def keep(self, line: str) -> bool:
        text = line.strip()
        if _JVM_NOTICE.match(text):
            self.held += 1
            return False
        if _IVY_START.match(text):
            self._in_ivy = True
        if not self._in_ivy:
            return True
        done = _IVY_DONE.match(text)
        if done:  # ... and ends with this one
            self._in_ivy = False
            self._copied, self._retrieved = int(done[1]), int(done[2])
        elif not (_IVY_START.match(text) or _IVY_ROUTINE.match(text)):
            return True  # not routine: an unresolved module, a failed download
        self.held += 1
        return False

    def ivy_summary(self) -> str | None:
        """One line for the task log once Ivy has finished, else None."""
        if not (self._copied or self._retrieved):
            return None
        jars = self._copied + self._retrieved
        return (
            f"Spark resolved spark.jars.packages through Ivy ({jars} jars, {self._copied} "
            f"downloaded; {self.held} lines of its report not shown at spark_log_level WARN). "
            f"Set PGLOGREPL_DELTA_JARS to a folder of Delta's jars (`make jars`) to skip it"
        )
