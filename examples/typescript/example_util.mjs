// What retry_loop.mjs and multi_step_rollback.mjs share: the workspace, the
// report lines (the same as the Python and shell examples print) and hooks.
//
//   CHECKPOINT <id> name=<name> duration_ms=<n> size_bytes=<n>
//   RESTORED <id> duration_ms=<n> ok=<true|false> stopped=[..] started=[..] failed=[..]
import { spawnSync } from 'node:child_process'
import { statSync } from 'node:fs'
import { resolve } from 'node:path'

/** The managed root: the argument, else CKPTD_WORKSPACE. @returns {string} */
export function workspacePath (arg) {
  const path = arg || process.env.CKPTD_WORKSPACE
  if (!path) fail('usage: give the workspace (a directory ckptd manages) as an argument or in CKPTD_WORKSPACE')
  let isDir = false
  try { isDir = statSync(path).isDirectory() } catch {}
  if (!isDir) fail(`workspace ${path} is not a directory`)
  return resolve(path)
}

/** @param {string} msg @returns {never} */
export function fail (msg) {
  console.error(msg)
  process.exit(2)
}

const names = (list) => `[${(list || []).join(',')}]`

/** @param {import('../../clients/typescript/src/index.js').Checkpoint} cp */
export function reportCheckpoint (cp) {
  console.log(`CHECKPOINT ${cp.checkpoint_id} name=${cp.name} duration_ms=${cp.duration_ms} size_bytes=${cp.size_bytes}`)
  runHook('CKPTD_AFTER_CREATE_HOOK', cp.checkpoint_id)
}

/** @param {import('../../clients/typescript/src/index.js').RestoreReport} r */
export function reportRestore (r) {
  console.log(`RESTORED ${r.checkpoint_id} duration_ms=${r.restore_duration_ms} ok=${r.ok} ` +
    `stopped=${names(r.stopped_services)} started=${names(r.started_services)} failed=${names(r.failed_services)}`)
  runHook('CKPTD_AFTER_RESTORE_HOOK', r.checkpoint_id)
}

/** Run the executable named by $name with the checkpoint id, if set. */
export function runHook (name, checkpointId) {
  const hook = process.env[name]
  if (!hook) return
  const r = spawnSync(hook, [checkpointId], { stdio: 'inherit' })
  if (r.status !== 0) throw new Error(`${name} ${hook} failed: ${r.error?.message ?? 'exit ' + r.status}`)
}

/** Run a program in the workspace; its exit status (1 if it could not start). */
export function run (argv, cwd, env = process.env) {
  const r = spawnSync(argv[0], argv.slice(1), { cwd, env, stdio: 'inherit' })
  return r.status ?? 1
}
