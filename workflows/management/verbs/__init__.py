"""The verbs of `manage.py agent`, one module per family: each adds its verbs' parsers
(``add_parsers``) and maps each verb to the function that runs it (``RUN``)."""
