# Findings, verdict and target models (owned by the verdict room); "X as X" marks a re-export.
from k3fleet.models.findings import BlockedHost as BlockedHost
from k3fleet.models.findings import Canary as Canary
from k3fleet.models.findings import ChangePlan as ChangePlan
from k3fleet.models.findings import Finding as Finding
from k3fleet.models.findings import FleetVerdict as FleetVerdict
from k3fleet.models.findings import HostVerdict as HostVerdict
from k3fleet.models.findings import PackageChange as PackageChange
from k3fleet.models.findings import UpgradeItem as UpgradeItem
from k3fleet.models.findings import VerdictSummary as VerdictSummary
from k3fleet.models.findings import fleet_verdict_json_schema as fleet_verdict_json_schema
from k3fleet.models.target import CudaDriverMatrix as CudaDriverMatrix
from k3fleet.models.target import MatrixRow as MatrixRow
from k3fleet.models.target import Target as Target
