// Types of ckptd-client. The payload types come from api.d.ts, generated from
// api/openapi.yaml by openapi-typescript (`npm run gen-types`): they follow
// the spec, and `npm run check` (tsc --strict) fails when the client drifts.
import type { components } from './api.js'

type Schemas = components['schemas']
export type Checkpoint = Schemas['Checkpoint']
export type CheckpointList = Schemas['CheckpointList']
export type CreateRequest = Schemas['CreateRequest']
export type RestoreRequest = Schemas['RestoreRequest']
export type RestoreReport = Schemas['RestoreReport']
export type Health = Schemas['Health']
export type PushRequest = Schemas['PushRequest']
export type PushResult = Schemas['PushResult']
export type PullRequest = Schemas['PullRequest']
export type Problem = Schemas['Problem']
export type ProblemCode = NonNullable<Problem['code']>

export const DEFAULT_URL: string

export interface ClientOptions {
  /** default CKPTD_URL, else http://127.0.0.1:7070 */
  url?: string
  /** a unix socket (ckptd --listen unix:PATH); default CKPTD_SOCKET */
  socketPath?: string
  /** bearer token; default CKPTD_TOKEN */
  token?: string
  /** how long to wait for one answer (default 300000) */
  timeoutMs?: number
  /** how many times a call is sent again after a timeout, a dropped connection, a 503 or a 409 idempotency_in_progress (default 3) */
  retries?: number
  /** first backoff, doubling (default 200) */
  backoffMs?: number
}

export interface CreateOptions extends CreateRequest {
  /** poll until active; implies async (default false) */
  wait?: boolean
  /** default: a random UUID per call, reused by its retries */
  idempotencyKey?: string
  pollMs?: number
}

export interface RestoreOptions extends RestoreRequest {
  idempotencyKey?: string
}

export interface PushOptions {
  /** push the base as the first layer (default true) */
  base?: boolean
  idempotencyKey?: string
}

export interface PullOptions {
  /** image root path -> this daemon's root */
  roots?: Record<string, string>
  idempotencyKey?: string
}

export class CkptdError extends Error {
  constructor (status: number, code: string, detail: string, body?: Record<string, unknown>)
  /** HTTP status; 0 when no answer came */
  status: number
  code: ProblemCode | string
  detail: string
  body: Record<string, unknown>
}
/** ckptd could not be reached: the request was not sent. */
export class NotReachable extends CkptdError {}
export const ConnectionFailed: typeof NotReachable
/** Sent, but no answer in time (or the connection broke) and the retries ran out: it may have happened. */
export class OutcomeUnknown extends CkptdError {}
/** ckptd answered with an error (problem+json). */
export class ApiError extends CkptdError {}
export class BadRequest extends ApiError {}
export class Unauthorized extends ApiError {}
export class LimitReached extends ApiError {}
export class NotFound extends ApiError {}
export class MethodNotAllowed extends ApiError {}
export class Conflict extends ApiError {}
export class IdempotencyInProgress extends Conflict {}
export class IdempotencyKeyReused extends ApiError {}
export class Expired extends ApiError {}
export class PayloadTooLarge extends ApiError {}
export class UnsupportedMediaType extends ApiError {}
export class ServerError extends ApiError {}
export class Unavailable extends ApiError {}
export class InsufficientStorage extends ApiError {}
/** a push or pull whose registry failed or refused (502) */
export class RegistryFailed extends ApiError {}
export class CreateFailed extends ApiError {}

export function errorFromResponse (status: number, text: string): ApiError

export interface Checkpoints {
  create (opts: CreateOptions): Promise<Checkpoint>
  wait (id: string, opts?: { pollMs?: number, timeoutMs?: number }): Promise<Checkpoint>
  list (opts?: { name?: string }): Promise<Checkpoint[]>
  get (id: string): Promise<Checkpoint>
  delete (id: string): Promise<void>
  restore (id: string, opts?: RestoreOptions): Promise<RestoreReport>
  push (id: string, ref: string, opts?: PushOptions): Promise<PushResult>
  pull (ref: string, opts?: PullOptions): Promise<Checkpoint>
}

export class Client {
  constructor (opts?: ClientOptions)
  readonly url: string
  readonly socketPath: string | undefined
  readonly token: string | undefined
  timeoutMs: number
  retries: number
  backoffMs: number
  readonly checkpoint: Checkpoints
  health (): Promise<Health>
  request (method: string, path: string, body?: object, idempotencyKey?: string): Promise<any>
}
