from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="Order",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True,
                                           serialize=False, verbose_name="ID")),
                ("item", models.CharField(max_length=100)),
                ("processed_at", models.DateTimeField(null=True)),
            ],
        ),
        migrations.CreateModel(
            name="Tick",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True,
                                           serialize=False, verbose_name="ID")),
                ("label", models.CharField(max_length=100)),
                ("at", models.DateTimeField(auto_now_add=True)),
            ],
        ),
    ]
