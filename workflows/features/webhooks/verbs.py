"""`manage.py agent webhook …`: outbound webhook subscriptions and their deliveries (docs/live.md)."""
from __future__ import annotations

from typing import Any

from rich.table import Table

from workflows.errors import InvalidInput, NotFound
from workflows.features.webhooks import services as hooks
from workflows.management.verbs.common import Output, Verb
from workflows.models import WebhookDelivery, WebhookSubscription

HELP = ("Outbound webhooks: `webhook add --name N --url URL --secret S [--event KIND]… [--kind K]… "
        "[--launcher USER]…`; `webhook list`; `webhook deliveries NAME [--status S]`; `webhook redeliver PK`; "
        "`webhook remove NAME`.")


def add_parsers(verb: Verb) -> None:
    sub = verb("webhook", HELP)
    sub.add_argument("action", choices=("add", "list", "deliveries", "redeliver", "remove"))
    sub.add_argument("target", nargs="?", help="deliveries, remove: the webhook's name; redeliver: a delivery's pk")
    sub.add_argument("--name", help="add: the webhook's name")
    sub.add_argument("--url", help="add: where deliveries are POSTed")
    sub.add_argument("--secret", help="add: the signing secret, 32+ characters")
    sub.add_argument("--event", action="append", default=[], metavar="KIND", help="add: an event kind; none: all")
    sub.add_argument("--kind", action="append", default=[], help="add: only workflows of this kind")
    sub.add_argument("--launcher", action="append", default=[], metavar="USER",
                     help="add: only workflows they launched")
    sub.add_argument("--status", choices=WebhookDelivery.Status.values, help="deliveries: only these")


def subscription_named(name: str | None) -> WebhookSubscription:
    found = WebhookSubscription.objects.filter(name=name or "").first()
    if found is None:
        raise NotFound(f"No webhook is named {name!r}; `agent webhook list` lists them.")
    return found


def webhook(command: Output, options: dict[str, Any]) -> None:
    action, target = options["action"], options["target"]
    if (action in ("add", "list")) == (target is not None):
        raise InvalidInput(f"`webhook {action}` takes " + ("no name or pk" if action in ("add", "list") else
                           "the webhook's name" if action != "redeliver" else "the delivery's pk") + ".")
    if action == "add":
        sub = hooks.webhook_subscription_create(name=options["name"] or "", url=options["url"] or "",
                                                secret=options["secret"] or "", event_kinds=options["event"],
                                                workflow_kinds=options["kind"], launchers=options["launcher"])
        command.emit(options, hooks.subscription_json(sub),
                      f"Webhook {sub.pk} ({sub.name}) → {sub.url}: told of "
                      f"{', '.join(sub.event_kinds) or 'every event'} recorded from now on.")
    elif action == "list":
        rows = [hooks.subscription_json(s) for s in WebhookSubscription.objects.order_by("pk")]
        if options["json"]:
            command.emit(options, rows, "")
            return
        table = Table("id", "name", "url", "events", "pending", "delivered", "failed")
        for r in rows:
            table.add_row(str(r["id"]), r["name"], r["url"], ", ".join(r["event_kinds"]) or "all",
                          *(str(r["deliveries"][s]) for s in ("pending", "delivered", "failed")))
        command.console.print(table if rows else "No webhooks yet; add one: `agent webhook add --name N --url URL "
                                                 "--secret S`.")
    elif action == "deliveries":
        qs = subscription_named(target).deliveries.order_by("-pk")
        if options["status"]:
            qs = qs.filter(status=options["status"])
        rows = [hooks.delivery_json(d) for d in qs[:100]]
        if options["json"]:
            command.emit(options, rows, "")
            return
        table = Table("pk", "delivery", "workflow", "seq", "event", "status", "attempts", "last answer")
        for r in rows:
            table.add_row(str(r["id"]), r["delivery_id"], str(r["workflow_id"]), str(r["seq"]), r["kind"], r["status"],
                          str(r["attempts"]), str(r["last_status_code"] or r["last_error"][:40]))
        command.console.print(table if rows else "No deliveries yet.")
    elif action == "redeliver":
        if not target.isdigit():
            raise InvalidInput(f"`webhook redeliver` takes a delivery's pk (a number), not {target[:30]!r}.")
        outcome = hooks.webhook_delivery_redeliver(delivery_id=int(target))
        command.emit(options, {"id": int(target), "outcome": outcome.value},
                      f"Delivery {target} " + ("will be sent again at once." if outcome == hooks.Outcome.APPLIED
                                               else "is pending already; nothing changed."))
    else:
        sub = subscription_named(target)
        hooks.webhook_subscription_remove(subscription_id=sub.pk)
        command.emit(options, {"id": sub.pk, "outcome": "removed"}, f"Webhook {sub.name} removed.")


RUN = {"webhook": webhook}
