"""Observability: a node's scrape targets (:mod:`.targets`), the supervisor's metrics and admin
port (:mod:`.supervisor`, :mod:`.admin_http`), Grafana dashboards (:mod:`.dashboards`,
``python -m hloserve.observability dashboards``). Metrics: docs/observability.md.
"""
