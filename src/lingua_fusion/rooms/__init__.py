"""Rooms: one published stream, many read-only listeners, each target language computed once per room.

- ``model.py``: a room's record, listener tokens, what a listener is sent (``project``: pure)
- ``bus.py``: the ``RoomBus`` and ``RoomDirectory`` Protocols and their in-process implementations
- ``redis_bus.py``: the same on Redis (streams with MAXLEN for the live feed, a sorted set of finals for history),
  so a listener on gateway B hears a room published on gateway A
- ``feed.py``: one reader of a room per gateway fanning out to its listeners' bounded queues
- ``publisher.py``: the tap on a publishing StreamSession and the sync of its targets with what listeners ask for
- ``service.py``: ``RoomService``: create, mint tokens, list, end, publish, join
"""
