"""Access: API tokens (created with their secret shown once, revoked, checked on every request)
and approver roles (the groups an approval wait names); their admin pages and `manage.py agent
token | role`. The API's authentication (``workflows.api.auth``) calls ``tokens``."""
