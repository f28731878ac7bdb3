import type { LoopStopOperation } from '../../shared/types';
import { compact, segment } from '../../shared/parameters';

/** `GET /v1/operations/{id}`: the record (state, attempt, receipt), never the payload. */
export const get: LoopStopOperation = {
	request(i, flow) {
		return {
			method: 'GET',
			path: `/v1/operations/${segment(this, 'operationId', i)}`,
			// The operation lives in its workflow's namespace.
			qs: compact({ workflow: flow.workflow, execution_mode: flow.executionMode }),
		};
	},
};
