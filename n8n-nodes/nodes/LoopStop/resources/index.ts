import type { LoopStopOperation } from '../shared/types';
import * as activation from './activation';
import * as check from './check';
import * as effect from './effect';
import * as operation from './operation';
import * as task from './task';

export { activationDescription } from './activation';
export { checkDescription } from './check';
export { effectDescription } from './effect';
export { operationDescription } from './operation';
export { taskDescription } from './task';

/** Every operation of the node, by resource and operation value. */
export const OPERATIONS: Record<string, Record<string, LoopStopOperation>> = {
	activation: { checkTrigger: activation.checkTrigger },
	effect: { register: effect.register },
	operation: {
		begin: operation.begin,
		commit: operation.commit,
		fail: operation.fail,
		reconcile: operation.reconcile,
		get: operation.get,
	},
	task: {
		create: task.create,
		admitToolCall: task.admitToolCall,
		recordResult: task.recordResult,
		complete: task.complete,
		stop: task.stop,
		get: task.get,
	},
	check: { run: check.run },
};

/** Output names of the branching operations, keyed `resource.operation`. */
export const OUTPUT_NAMES: Record<string, string[]> = Object.fromEntries(
	Object.entries(OPERATIONS).flatMap(([resource, ops]) =>
		Object.entries(ops)
			.filter(([, op]) => op.outputs)
			.map(([name, op]) => [`${resource}.${name}`, op.outputs as string[]]),
	),
);
