"""Plain records every layer shares: what the hooks read from a server (``records``), what the
catalog inspection found (``facts``) and the decisions sensors, triggers and health checks make
from them (``verdicts``). Nothing here talks to a server or imports Airflow, so a rule that
judges them is tested with hand-built values, and any folder may import them."""
