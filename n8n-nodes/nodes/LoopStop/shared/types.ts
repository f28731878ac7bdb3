import type { IDataObject, IExecuteFunctions, IHttpRequestMethods } from 'n8n-workflow';

/** One request to the sidecar: `path` starts with `/v1/` and is already URL-encoded. */
export interface LoopStopRequest {
	method: IHttpRequestMethods;
	path: string;
	body?: IDataObject;
	qs?: IDataObject;
}

/** What every request carries without the user typing it. */
export interface FlowContext {
	/** The workflow id (`$workflow.id`). */
	workflow: string;
	/** `test` for a manual execution from the editor, else `production` (`$execution.mode`). */
	executionMode: 'test' | 'production';
	/** `$execution.id`; every request body carries it as `execution_id` (the transport adds it). */
	executionId?: string;
}

/**
 * One operation of the Loop Stop node.
 *
 * `request` builds the call for item `itemIndex`; `route` names the output an
 * answer goes to and returns `undefined` for a decision it does not know, which
 * the node turns into an error (an unknown decision never falls through to a
 * branch that acts). Operations without `outputs` have one unnamed output.
 */
export interface LoopStopOperation {
	outputs?: string[];
	/** The output that receives an item's error under Continue On Fail: one that never acts. */
	errorOutput?: string;
	request(this: IExecuteFunctions, itemIndex: number, flow: FlowContext): LoopStopRequest;
	route?(answer: IDataObject): string | undefined;
}
