"""HTTP routes: parse a request, call the domain, shape the answer. Never spawn a process."""
