"""The kind's own table, as of its latest migration (0002 renamed ``email`` to ``contact_email``)."""
from django.db import models


class Contact(models.Model):
    """Who was notified about a ticket; written by the kind's ``notify`` activity."""

    number = models.CharField(max_length=40, help_text="Ticket number.")
    contact_email = models.EmailField(help_text="Address the notification went to (``email`` before 0002).")
    operation_id = models.CharField(max_length=200, unique=True, help_text="The notify activity that wrote it.")

    def __str__(self) -> str:
        return f"{self.number} → {self.contact_email}"
