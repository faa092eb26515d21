#!/usr/bin/env python3
"""Write a small synthetic shop event log (CSV), the example of docs/your_data.md.

    python scripts/make_event_log.py --out outputs/shop/events.csv [--users 300] [--items 120] [--seed 0]

Columns: user_id (c0001...), item_id (SKUs: sku-0001...), timestamp (ISO 8601, UTC), event (click, cart, buy) and
segment (new, regular, vip: a categorical user feature). Each segment shops mostly in its own third of the catalogue
and browses it in an order of its own, so a ranker can learn who looks at what next; an item is put in the cart
after some clicks on it and bought after some carts. Only the standard library: it runs anywhere.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import random
from pathlib import Path

SEGMENTS = ("new", "regular", "vip")
START = dt.datetime(2025, 3, 1, tzinfo=dt.UTC)


def make_rows(num_users: int, num_items: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    skus = [f"sku-{k:04d}" for k in range(1, num_items + 1)]
    third = num_items // len(SEGMENTS)
    shelves = {s: skus[k * third:(k + 1) * third] for k, s in enumerate(SEGMENTS)}
    routes = {s: rng.sample(shelf, len(shelf)) for s, shelf in shelves.items()}  # each segment's browsing order
    rows = []
    for u in range(1, num_users + 1):
        user, segment = f"c{u:04d}", SEGMENTS[u % len(SEGMENTS)]
        route, at = routes[segment], rng.randrange(third)
        when = START + dt.timedelta(seconds=rng.randrange(30 * 86400))
        for _ in range(rng.randint(12, 40)):
            if rng.random() < 0.85:  # the next item on the segment's route, now and then one further
                at = (at + rng.choice((1, 1, 1, 2))) % len(route)
                sku = route[at]
            else:  # a look elsewhere in the catalogue
                sku = rng.choice(skus)
            events = ["click"]
            if rng.random() < 0.3:
                events.append("cart")
                if rng.random() < 0.5:
                    events.append("buy")
            for event in events:
                when += dt.timedelta(seconds=rng.choice((5, 30, 120, 600, 3600, 86400)))
                rows.append({"user_id": user, "item_id": sku, "timestamp": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
                             "event": event, "segment": segment})
    rng.shuffle(rows)  # a log export is rarely in time order: the reader sorts each user's events by time
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="outputs/shop/events.csv")
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--items", type=int, default=120)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rows = make_rows(args.users, args.items, args.seed)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["user_id", "item_id", "timestamp", "event", "segment"])
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out}: {len(rows)} events of {args.users} users on {args.items} items")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
