"""The operators' UI in the Django admin: an approval queue, workflow inspection and operator actions.

Nothing here writes durable state except through ``workflows.services``: generic admin
forms cannot add, change or delete workflow rows. Every decision or action is a POST with
a CSRF token, checked for permission before the service is called (the service checks again).
"""
from django.contrib import admin

from workflows.admin import approvals, records, workflows  # noqa: F401  (registers the ModelAdmins)

admin.site.site_header = "agentops operations"
admin.site.site_title = "agentops"
admin.site.index_title = "Agents, approvals and workers"
# The admin is the whole site: no "View site" link to a page that does not exist.
admin.site.site_url = None
# One app with two pages: its links are on every page already, and the sidebar took a quarter of a laptop's width.
admin.site.enable_nav_sidebar = False
# The index gains an "Approvals waiting for you" box (templates/admin/agentops_index.html).
admin.site.index_template = "admin/agentops_index.html"
