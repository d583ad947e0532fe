from django.contrib import admin

from .models import Order, Tick

admin.site.register(Order)
admin.site.register(Tick)
