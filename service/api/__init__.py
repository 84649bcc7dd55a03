"""HTTP layer: parses requests and calls the supervisor and repository; never spawns processes."""
