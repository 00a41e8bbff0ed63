"""Room figures on /metrics (this gateway's): rooms it publishes, its listeners, what was dropped and why."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from ..observability import gauge


class RoomMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry or CollectorRegistry()
        self.rooms = gauge("linguafusion_rooms_published", "Rooms whose publisher streams through this gateway",
                           registry=r)
        self.listeners = gauge("linguafusion_room_listeners", "Room listeners connected to this gateway",
                               registry=r)
        self.feeds = gauge("linguafusion_room_feeds", "Rooms this gateway follows for its listeners", registry=r)
        self.joined = Counter("linguafusion_room_listeners_joined_total", "Listeners that joined a room",
                              registry=r)
        self.left = Counter("linguafusion_room_listeners_left_total",
                            "Listeners that left, by reason (done, disconnected, slow_consumer)", ["reason"],
                            registry=r)
        self.room_events = Counter("linguafusion_room_events_total", "Events published into rooms, by type",
                                   ["type"], registry=r)
        self.room_events_dropped = Counter("linguafusion_room_events_dropped_total",
                                           "Room events a publisher could not hand to the bus (it was far behind)",
                                           registry=r)
