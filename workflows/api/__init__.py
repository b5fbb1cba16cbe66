"""The HTTP API (django-ninja): `manage.py agent`'s operations over HTTP, authenticated by API tokens."""
