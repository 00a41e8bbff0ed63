"""One live stream and the service that owns every stream: protocol, events, session, jobs, journal."""
