"""A tenant's billing contacts (``Tenant.billing_emails``) become an email alert endpoint of the
tenant's, subscribed to the budget warnings: the same subscription model as every other alert
(docs/alerts.md, "Email"). Every tenant's addresses are copied, in order, before the column goes;
going back copies them into the column again."""

from django.db import migrations, models

WARNING_EMAIL_TYPES = ["threshold.crossed", "budget.projected_to_exceed"]
ACTOR = "migration 0032_billing_contacts_endpoint"


def _split(value):
    import re

    return [part.strip() for part in re.split(r"[,;\n]", value or "") if part.strip()]


def _checks_now(schema_editor):
    """PostgreSQL defers foreign-key checks to the commit; a table with such checks pending cannot
    be altered in the same transaction (the column removal or constraint change that follows)."""
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")


def contacts_to_endpoints(apps, schema_editor):
    Tenant = apps.get_model("llm_budgets", "Tenant")
    AlertEndpoint = apps.get_model("llm_budgets", "AlertEndpoint")
    AlertEndpoint.objects.bulk_create(
        [
            AlertEndpoint(
                tenant_id=tenant_id,
                kind="email",
                target=", ".join(_split(emails)),
                event_types=WARNING_EMAIL_TYPES,
                description="Billing contacts",
                billing_contacts=True,
                created_by=ACTOR,
            )
            for tenant_id, emails in Tenant.objects.exclude(billing_emails="").values_list(
                "pk", "billing_emails"
            )
            if _split(emails)
        ]
    )
    _checks_now(schema_editor)


def endpoints_to_contacts(apps, schema_editor):
    Tenant = apps.get_model("llm_budgets", "Tenant")
    AlertEndpoint = apps.get_model("llm_budgets", "AlertEndpoint")
    for tenant_id, target in AlertEndpoint.objects.filter(billing_contacts=True).values_list(
        "tenant_id", "target"
    ):
        Tenant.objects.filter(pk=tenant_id).update(billing_emails=target)
    AlertEndpoint.objects.filter(billing_contacts=True).delete()
    _checks_now(schema_editor)


class Migration(migrations.Migration):
    dependencies = [
        ("llm_budgets", "0031_alerts"),
    ]

    operations = [
        migrations.AddField(
            model_name="alertendpoint",
            name="billing_contacts",
            field=models.BooleanField(
                default=False,
                editable=False,
                help_text="The tenant's billing contacts (set by ensure_tenant's billing_emails).",
            ),
        ),
        migrations.AddConstraint(
            model_name="alertendpoint",
            constraint=models.UniqueConstraint(
                condition=models.Q(("billing_contacts", True)),
                fields=("tenant",),
                name="llmb_alert_one_billing_contacts",
            ),
        ),
        migrations.RunPython(contacts_to_endpoints, endpoints_to_contacts),
        migrations.RemoveField(
            model_name="tenant",
            name="billing_emails",
        ),
    ]
