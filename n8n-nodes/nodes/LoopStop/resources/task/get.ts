import type { LoopStopOperation } from '../../shared/types';
import { segment } from '../../shared/parameters';

/** `GET /v1/tasks/{id}`: the task, its counters and, once it ended, its envelope. */
export const get: LoopStopOperation = {
	request(i, flow) {
		return {
			method: 'GET',
			path: `/v1/tasks/${segment(this, 'taskId', i)}`,
			qs: { execution_mode: flow.executionMode },
		};
	},
};
