#!/usr/bin/env node
// Multi-step rollback: checkpoint before each step of a workflow; when a step
// fails, restore the second-to-last checkpoint and stop.
//
//   CKPTD_URL=http://127.0.0.1:7070 node multi_step_rollback.mjs /path/to/workspace [--fail-step N]
//
// As in the SDK's example, the checkpoint restored on a failure at step k is
// the one taken before step k-1 (none when step 1 fails). Step N (default 3,
// or CKPTD_FAIL_STEP; 0 = none) does its work, then damages the tree and
// exits 1. Exit status: 0 when every step succeeded, 1 after a failed step.
import { Client, CkptdError } from '../../clients/typescript/src/index.js'
import { fail, reportCheckpoint, reportRestore, run, workspacePath } from './example_util.mjs'

const WORKFLOW = [
  { name: 'prepare',
    code: `const fs = require('fs')
fs.mkdirSync('app', { recursive: true })
fs.writeFileSync('app/config.json', JSON.stringify({ stage: 'prepared', rows: 3 }))` },
  { name: 'fetch',
    code: `const fs = require('fs')
fs.mkdirSync('app/data', { recursive: true })
fs.writeFileSync('app/data/input.csv', 'id,value\\n1,10\\n2,20\\n3,30\\n')` },
  { name: 'build',
    code: `const fs = require('fs')
const rows = fs.readFileSync('app/data/input.csv', 'utf8').trim().split('\\n').slice(1)
fs.mkdirSync('app/build', { recursive: true })
fs.writeFileSync('app/build/total.txt', String(rows.reduce((s, r) => s + Number(r.split(',')[1]), 0)))
fs.writeFileSync('app/config.json', JSON.stringify({ stage: 'built', rows: rows.length }))` },
  { name: 'test',
    code: `const fs = require('fs')
const total = Number(fs.readFileSync('app/build/total.txt', 'utf8'))
fs.writeFileSync('app/report.txt', \`total \${total}: \${total === 60 ? 'pass' : 'FAIL'}\\n\`)` }
]

// Appended to the failing step: half-done work, then failure.
const SABOTAGE = `
fs.writeFileSync('app/partial.tmp', 'half written')
fs.rmSync('app/data', { recursive: true, force: true })
fs.unlinkSync('app/config.json')
console.error('step failed (simulated)')
process.exit(1)`

async function runWorkflow (sandbox, workspace, failStep) {
  const checkpoints = []
  let failed = false
  try {
    for (const [i, step] of WORKFLOW.entries()) {
      const k = i + 1
      const cp = await sandbox.checkpoint.create({ name: `before-${step.name}` })
      reportCheckpoint(cp)
      checkpoints.push(cp.checkpoint_id)
      const code = k === failStep ? step.code + SABOTAGE : step.code
      const rc = run([process.execPath, '-e', code], workspace)
      if (rc === 0) {
        console.log(`STEP ${k} ${step.name} ok`)
        continue
      }
      console.log(`STEP ${k} ${step.name} failed exit=${rc}`)
      failed = true
      const lastGood = checkpoints[checkpoints.length - 2]
      if (lastGood) reportRestore(await sandbox.checkpoint.restore(lastGood))
      else console.log('NO-RESTORE no checkpoint before the previous step')
      break
    }
  } finally {
    for (const id of checkpoints) await sandbox.checkpoint.delete(id)
  }
  console.log(failed ? 'GAVE UP' : 'DONE ok')
  return !failed
}

const args = process.argv.slice(2)
let failStep = Number(process.env.CKPTD_FAIL_STEP ?? '3')
const at = args.indexOf('--fail-step')
if (at >= 0) {
  failStep = Number(args[at + 1])
  args.splice(at, 2)
}
if (!Number.isInteger(failStep)) fail('--fail-step takes a step number (0: none)')
const workspace = workspacePath(args[0])
try {
  process.exitCode = (await runWorkflow(new Client(), workspace, failStep)) ? 0 : 1
} catch (e) {
  if (!(e instanceof CkptdError)) throw e
  fail(`ckptd error: ${e.message}`)
}
