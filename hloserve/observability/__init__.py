"""Observability: Prometheus scrape targets of a running node and hloserve's Grafana dashboards.

- :mod:`hloserve.observability.targets`: the file-based service discovery file that
  ``hloserve serve`` and ``hloserve node up`` write (every worker's metrics port, the gateway's
  and the supervisor's admin ports).
- :mod:`hloserve.observability.dashboards`: seven dashboards built with Grafana's
  ``grafana-foundation-sdk``; ``python -m hloserve.observability dashboards --out DIR
  [--check]`` writes them or checks the checked-in copies (``containers/grafana/dashboards``).

The metrics themselves, their names and labels: docs/observability.md.
"""
