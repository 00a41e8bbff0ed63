"""The load generator: many live streams against a real server, paced at real time, with an SLO report."""
