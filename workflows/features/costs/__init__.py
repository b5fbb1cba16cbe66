"""Costs and metrics, read from the durable rows: where a workflow's money went (``breakdown``, over
the API in ``api`` and on the workflow's admin page) and the Prometheus figures at ``/metrics``
(``metrics``). Reads only."""
