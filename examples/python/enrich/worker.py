"""Example WorkManager worker: prices an order.

Input: a CloudEvent whose data is {"items": [{"sku": ..., "price": ..., "qty": ...}]}.
Output: one CloudEvent of type "order.priced" (so it is published to the topic
"order.priced") with the total. The input's correlationid is copied to the
output by WorkManager; workers do not have to.
"""


def process(event):
    items = (event.get("data") or {}).get("items", [])
    total = sum(item["price"] * item.get("qty", 1) for item in items)
    return {
        "type": "order.priced",
        "subject": event["id"],
        "data": {"order_id": event["id"], "total": total, "items": len(items)},
    }
