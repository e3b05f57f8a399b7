"""``UsageRecord.period_start`` is ``reserved_at``: it holds when the reservation was made (the
time that picks the period charged), not a period's start."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("llm_budgets", "0009_jobs_uncertain_rollups_warnings")]

    operations = [
        migrations.RenameField(
            model_name="usagerecord", old_name="period_start", new_name="reserved_at"
        ),
        migrations.AlterField(
            model_name="usagerecord",
            name="reserved_at",
            field=models.DateTimeField(
                help_text="When the reservation was made: the period it was made in is charged, "
                "and rollups and reports bucket the line by this time."
            ),
        ),
        # The index follows the renamed column in the database by itself; only Django's record
        # of its fields changes (no rebuild of an index on the ledger).
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="usagerecord", name="llmb_usage_tenant_period"),
                migrations.AddIndex(
                    model_name="usagerecord",
                    index=models.Index(
                        fields=["tenant", "reserved_at"], name="llmb_usage_tenant_period"
                    ),
                ),
            ],
            database_operations=[],
        ),
    ]
