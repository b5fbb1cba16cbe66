"""Webhooks, both ways, and the event feed they read. Inbound (``inbound``): an outside system
delivers a signed signal to a workflow. Outbound (``services``, with its ``api``, ``admin`` and
``verbs``): subscriptions to the events of every workflow, delivered signed, in order, at least once,
from the all-workflows cursor of ``feed``, which the live streams read too."""
