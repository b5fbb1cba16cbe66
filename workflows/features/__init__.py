"""The features around the kernel: each package holds one feature's services and the interfaces
that are its alone (its admin pages, API routes, ``manage.py agent`` verbs). A feature imports the
kernel; the kernel imports no feature (``tests/workflows/test_imports.py``). The rows stay in
``workflows.models`` under the one app label, so the migrations are the app's, as they were."""
