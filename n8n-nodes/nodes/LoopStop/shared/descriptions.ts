import type { INodeProperties } from 'n8n-workflow';

/**
 * The "Additional Fields" collection of one operation: optional parameters,
 * read as `additionalFields.<name>`, shown only for that operation.
 */
export function additionalFields(
	show: Record<string, string[]>,
	options: INodeProperties[],
): INodeProperties {
	return {
		displayName: 'Additional Fields',
		name: 'additionalFields',
		type: 'collection',
		placeholder: 'Add Field',
		default: {},
		displayOptions: { show },
		options,
	};
}
