"""Self-contained HTML reports (inline SVG plots, inline CSS, no script) of one incident
or one job, read from ClickHouse: ``incident_page(client, id)``, ``job_page(client, job)``.
"""

from failslow.storage.report.data import ReportError
from failslow.storage.report.page import incident_page, job_page

__all__ = ["ReportError", "incident_page", "job_page"]
