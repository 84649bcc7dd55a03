"""Identity: who a caller is and what they may see.

Decides: teams, users and their roles, personal tokens (made, listed, revoked), who a JWT of an
identity provider names (``idtokens``), and which team's jobs, sweeps, secrets and packages a
caller sees (``caller.Caller``). May import: the contract, ``service.settings``,
``service.store``; no other domain folder.
"""
