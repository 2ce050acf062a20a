// The implementation (client.js, typed by its JSDoc) must fit the published
// declarations (index.d.ts): tsc fails here when they drift apart.
import * as impl from '../src/client.js'
import type * as decl from '../src/index.js'

export const client: typeof decl.Client = impl.Client
export const errorFromResponse: typeof decl.errorFromResponse = impl.errorFromResponse
export const errors: Array<typeof decl.CkptdError> = [
  impl.CkptdError, impl.NotReachable, impl.OutcomeUnknown, impl.ApiError, impl.BadRequest, impl.Unauthorized,
  impl.LimitReached, impl.NotFound, impl.MethodNotAllowed, impl.Conflict, impl.IdempotencyInProgress,
  impl.IdempotencyKeyReused, impl.Expired, impl.PayloadTooLarge, impl.UnsupportedMediaType, impl.ServerError,
  impl.Unavailable, impl.InsufficientStorage, impl.CreateFailed
]
export async function sameShapes (c: impl.Client): Promise<void> {
  const d: decl.Client = c
  const cp: decl.Checkpoint = await c.checkpoint.create({ name: 'n' })
  const r: decl.RestoreReport = await c.checkpoint.restore(cp.checkpoint_id, { verify: true })
  void d; void r
}
