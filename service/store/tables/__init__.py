"""ORM tables, one module per area. The schema itself is owned by Alembic (migrations/); a test
checks they agree. Importing this package loads every table, so ``Base.metadata`` is whole."""

from service.store.tables.accounts import ApiToken, AuditEntry, PackageGrant, SlotUsage, Team, User
from service.store.tables.base import NAMING, Base
from service.store.tables.jobs import (
    Allocation,
    Job,
    JobLabel,
    MetricRecord,
    QueueSnapshot,
    SupervisorLease,
    Sweep,
    SweepTrial,
    TrackingExport,
    WebhookDelivery,
)

__all__ = ["Allocation", "ApiToken", "AuditEntry", "Base", "Job", "JobLabel", "MetricRecord", "NAMING", "PackageGrant", "QueueSnapshot", "SlotUsage", "SupervisorLease", "Sweep", "SweepTrial", "Team", "TrackingExport", "User", "WebhookDelivery"]
