"""Observability: a node's scrape targets, the supervisor's own metrics, Grafana dashboards.

- :mod:`hloserve.observability.targets`: the file-based service discovery file that
  ``hloserve serve`` and ``hloserve node up`` write (every worker's metrics port, the gateway's
  and the supervisor's admin ports).
- :mod:`hloserve.observability.dashboards`: seven dashboards built with Grafana's
  ``grafana-foundation-sdk``; ``python -m hloserve.observability dashboards --out DIR
  [--check]`` writes them or checks the checked-in copies (``containers/grafana/dashboards``).
- :mod:`hloserve.observability.supervisor`: what a supervising process (``serve``, ``node up``)
  starts and removes (:class:`NodeObservability`): its own metrics (workers up, restarts) on
  its admin port, and the targets file.
- :mod:`hloserve.observability.admin_http`: the admin HTTP port (GET routes on a daemon
  thread) of the supervisor and of the gateway.

The metrics themselves, their names and labels: docs/observability.md.
"""
