from django.db import migrations, models

# The body as bytes: the UTF-8 encoding of the text kept so far, in one statement where the
# database can say so (PostgreSQL's ``::bytea`` would read backslashes in the JSON as escapes).
_COPY = {
    "postgresql": "UPDATE {table} SET {body} = convert_to({payload}, 'UTF8')",
    "sqlite": "UPDATE {table} SET {body} = CAST({payload} AS BLOB)",
}


def body_from_payload(apps, schema_editor):
    """Each stored event keeps its body as bytes; the processed ones say so in ``state``."""
    Event = apps.get_model("llm_budgets", "StripeWebhookEvent")
    connection = schema_editor.connection
    copy = _COPY.get(connection.vendor)
    if copy is not None:
        quote = connection.ops.quote_name
        schema_editor.execute(
            copy.format(
                table=quote(Event._meta.db_table), body=quote("body"), payload=quote("payload")
            )
        )
    else:
        for event in Event.objects.only("pk", "payload").iterator(chunk_size=1000):
            Event.objects.filter(pk=event.pk).update(body=event.payload.encode("utf-8"))
    Event.objects.filter(processed_at__isnull=False).update(state="processed")


def payload_from_body(apps, schema_editor):
    """Back to text: a body that is not storable text (not UTF-8, or holding NUL) keeps a
    replacement character where it was."""
    Event = apps.get_model("llm_budgets", "StripeWebhookEvent")
    for event in Event.objects.only("pk", "body").iterator(chunk_size=1000):
        text = bytes(event.body).decode("utf-8", "replace").replace("\x00", "\ufffd")
        Event.objects.filter(pk=event.pk).update(payload=text)


class Migration(migrations.Migration):
    dependencies = [
        ("llm_budgets", "0035_job_run_failures"),
    ]

    operations = [
        migrations.AddField(
            model_name="stripewebhookevent",
            name="body",
            field=models.BinaryField(
                default=b"", help_text="The request body as received, byte for byte."
            ),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="stripewebhookevent",
            name="state",
            field=models.CharField(
                choices=[
                    ("received", "Received (processing failed or under way; Stripe retries it)"),
                    ("processed", "Processed"),
                    (
                        "unprocessable",
                        "Unprocessable (not acted on; a person reprocesses it)",
                    ),
                ],
                default="received",
                max_length=16,
            ),
        ),
        migrations.RunPython(body_from_payload, payload_from_body, elidable=True),
        # A default for the way back only: the column comes back empty, then is filled.
        migrations.AlterField(
            model_name="stripewebhookevent",
            name="payload",
            field=models.TextField(default=""),
        ),
        migrations.RemoveField(
            model_name="stripewebhookevent",
            name="payload",
        ),
        migrations.AlterModelOptions(
            name="stripewebhookevent",
            options={
                "ordering": ["-received_at"],
                "permissions": [
                    ("reprocess_stripewebhookevent", "Can reprocess a Stripe webhook event")
                ],
                "verbose_name": "Stripe webhook event",
            },
        ),
        migrations.AddIndex(
            model_name="stripewebhookevent",
            index=models.Index(fields=["state", "received_at"], name="llmb_webhook_state"),
        ),
    ]
