"""Telling approvers that a decision waits: the ``notify_approvers`` activity and its channels
(``activity``), scheduled when an approval wait opens and before it expires (``services``)."""
