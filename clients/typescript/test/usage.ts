// Type-checked only (tsc --strict --noEmit): the package as a user sees it.
import {
  Client, CkptdError, Expired, NotReachable, OutcomeUnknown, type Checkpoint, type RestoreReport
} from 'ckptd-client'

export async function flow (): Promise<number> {
  const sandbox = new Client({ timeoutMs: 60_000, retries: 5 })
  const cp: Checkpoint = await sandbox.checkpoint.create({ name: 'baseline', ttl_secs: 3600, labels: { job: '42' }, wait: true })
  let r: RestoreReport
  try {
    r = await sandbox.checkpoint.restore(cp.checkpoint_id)
  } catch (e) {
    if (e instanceof Expired) r = await sandbox.checkpoint.restore(cp.checkpoint_id, { if_expired: 'fresh' })
    else if (e instanceof OutcomeUnknown || e instanceof NotReachable) throw e
    else throw e as CkptdError
  }
  const names: string[] = r.started_services
  await sandbox.checkpoint.delete(cp.checkpoint_id)
  return r.restore_duration_ms + names.length + (cp.size_bytes ?? 0)
}
