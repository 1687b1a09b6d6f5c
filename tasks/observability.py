"""Observability (docs/observability.md): the OS's Prometheus on the head, on loopback, scraping
vLLM and the node exporter of every node over the fabric, with the deploy's recording and alert
rules; the OS's Alertmanager beside it, delivering the alerts to the site's webhooks; the deploy's collector of Spark metrics on every node; Grafana with the deploy's dashboards
when the site names its image. Off with `observability = false`: nothing installed or changed.

    pyinfra inventory.py tasks/observability.py     # this step alone, on converged nodes
"""

from pyinfra import host

from operations.observability import alertmanager_running, exporters_running, grafana_running, observability_settings, prometheus_running

cluster = host.data.cluster
settings = cluster.settings

if settings.observability:
    observed = observability_settings(cluster, host.name)

    exporters_running(
        name=f"Run the node exporter on rail 0 ({observed.rails[0]['address']}:{settings.node_exporter_port}) "
             "and the collector of Spark metrics",
        settings=observed,
    )

    alertmanager_running(
        name=f"Run Alertmanager on the head (127.0.0.1:{settings.alertmanager_port}), delivering to "
             + (f"{len(settings.alert_webhooks)} webhook(s)" if settings.alert_webhooks else "no receiver: alerts stay on the head"),
        settings=observed,
    )

    prometheus_running(
        name=f"Run Prometheus on the head (127.0.0.1:{settings.prometheus_port}, {settings.prometheus_retention_days} days or "
             f"{settings.prometheus_retention_gib} GiB) with the recording and alert rules",
        settings=observed,
    )

    if settings.grafana_image:
        grafana_running(name=f"Run Grafana on the head (127.0.0.1:{settings.grafana_port}) with the dashboards", settings=observed)
