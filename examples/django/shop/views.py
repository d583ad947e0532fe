from django.db import transaction
from django.http import HttpRequest, JsonResponse

from .models import Order
from .tasks import process_order


def place_order(request: HttpRequest) -> JsonResponse:
    """POST item=...: the order is saved and processed once the transaction commits;
    with fail=1 the transaction rolls back, and nothing is sent."""
    item = request.POST.get("item", "thing")
    try:
        with transaction.atomic():
            order = Order.objects.create(item=item)
            process_order.delay_on_commit(order.pk)
            if request.POST.get("fail"):
                raise ValueError("payment refused")
    except ValueError as exc:
        return JsonResponse({"error": str(exc)}, status=402)
    return JsonResponse({"order": order.pk}, status=201)
