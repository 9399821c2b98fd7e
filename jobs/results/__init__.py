"""What a job's run left: rank records, the failure card, metrics, outputs, the NCCL panel."""
